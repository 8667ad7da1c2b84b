package persist

// Rows is a driver's result set (pgx.Rows, *sql.Rows), as the scans below
// read it; the caller closes it.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Collect is the read scan of every store, written once: every row of rows
// read by scan, in order, then rows.Err.
func Collect[T any](rows Rows, scan func(Rows) (T, error)) ([]T, error) {
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// ConvHead is one conv_head row a retention step visits.
type ConvHead struct {
	ConvID string
	Head   uint64
}

// ScanConvHead reads (conv_id, head).
func ScanConvHead(r Rows) (ConvHead, error) {
	var c ConvHead
	var head int64
	err := r.Scan(&c.ConvID, &head)
	c.Head = uint64(head)
	return c, err
}

// TrimStep is one step of a retention pass (Retention.TrimBefore), written
// once for the stores that trim a conversation at a time: convs are the
// next page of up to limit conversations after the cursor, in the store's
// conv_id order; trim deletes one conversation's prefix of messages older
// than the cutoff (never at or past its head+1) and returns the rows it
// deleted. The cursor is the page's last conversation, or "" when the page
// was short (the pass is complete). On an error of trim it returns the rows
// deleted before it.
func TrimStep(convs []ConvHead, limit int, trim func(ConvHead) (int, error)) (next string, deleted int, err error) {
	for _, c := range convs {
		n, err := trim(c)
		if err != nil {
			return "", deleted, err
		}
		deleted += n
	}
	if len(convs) < limit {
		return "", deleted, nil
	}
	return convs[len(convs)-1].ConvID, deleted, nil
}

// CollectQuery is Collect for the answer of a driver's query: err is the
// query's, closeRows closes rows (after the scan; not called when err is
// set).
func CollectQuery[T any, R Rows](rows R, err error, closeRows func(R), scan func(Rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer closeRows(rows)
	return Collect(rows, scan)
}
