package sequencer

// MaxReceiptSeqs is the most seqs one GetReadReceipts call may name.
const MaxReceiptSeqs = 100

// The page size of ListReadPositions: 0 means DefaultReadPositions, more
// than MaxReadPositions is clamped to it.
const (
	DefaultReadPositions = 100
	MaxReadPositions     = 1000
)

// CheckReadReceipts checks a read-receipt request: a valid conv_id and
// 1..MaxReceiptSeqs seqs, each 1..2^63-1 (duplicates and any order
// allowed). The error names the first bad seq by its index.
func CheckReadReceipts(convID string, seqs []uint64) error {
	if err := CheckConvID(convID); err != nil {
		return err
	}
	if n := len(seqs); n < 1 || n > MaxReceiptSeqs {
		return invalid("seqs", "must hold 1..%d seqs, got %d", MaxReceiptSeqs, n)
	}
	for i, s := range seqs {
		if s == 0 || s >= MaxID {
			return Errorf(CodeInvalidArgument, "seqs[%d]: must be > 0 and < 2^63, got %d", i, s)
		}
	}
	return nil
}

// ReadPositionsPage checks a ListReadPositions request (a valid conv_id,
// after_uid below 2^63) and returns the page size it asks for: limit, 0
// meaning DefaultReadPositions, clamped to MaxReadPositions.
func ReadPositionsPage(convID string, afterUID uint64, limit uint32) (int, error) {
	if err := CheckConvID(convID); err != nil {
		return 0, err
	}
	if afterUID >= MaxID {
		return 0, invalid("after_uid", "must be < 2^63, got %d", afterUID)
	}
	switch {
	case limit == 0:
		return DefaultReadPositions, nil
	case limit > MaxReadPositions:
		return MaxReadPositions, nil
	}
	return int(limit), nil
}
