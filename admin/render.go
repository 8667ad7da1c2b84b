package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Table is a result as text: optional lines above, then aligned columns
// (Header may be nil for a key/value listing).
type Table struct {
	Lines  []string
	Header []string
	Rows   [][]string
}

// Tabler is a result that renders as a Table.
type Tabler interface{ Table() Table }

// Render writes v as indented JSON (asJSON) or as its aligned table.
func Render(w io.Writer, v Tabler, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	t := v.Table()
	for _, l := range t.Lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if t.Header != nil {
		fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
	}
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func (m Members) Table() Table {
	t := Table{Lines: []string{fmt.Sprintf("membership version %d, %d member rows (database clock %s)", m.Version, len(m.Members), ts(m.Now))},
		Header: []string{"NODE", "STATE", "LEASE LEFT", "LEASES", "RING", "API", "CLUSTER", "INCARNATION"}}
	for _, e := range m.Members {
		t.Rows = append(t.Rows, []string{e.NodeID, e.State, (time.Duration(e.LeaseLeftMs) * time.Millisecond).String(),
			strconv.Itoa(e.Leases), strconv.Itoa(e.RingPartitions), dash(e.APIAddr), dash(e.ClusterAddr), e.Incarnation})
	}
	return t
}

func (p Partitions) Table() Table {
	t := Table{Lines: []string{fmt.Sprintf("membership version %d, %d partitions, %d moving", p.Version, len(p.Partitions), p.Moving)},
		Header: []string{"PARTITION", "OWNER", "EPOCH", "RING OWNER", "MOVING"}}
	if len(p.citusWorkers) > 0 {
		t.Lines = append(t.Lines, fmt.Sprintf("citus: every partition's conversations are on the shards of all %d workers (%s): partitions and shards are not aligned; admin shards lists the shards",
			len(p.citusWorkers), strings.Join(p.citusWorkers, ", ")))
	}
	for _, e := range p.Partitions {
		owner := dash(e.Owner)
		if e.Owner != "" && !e.OwnerLive {
			owner += " (dead)"
		}
		t.Rows = append(t.Rows, []string{strconv.Itoa(int(e.Partition)), owner, u(e.Epoch), dash(e.RingOwner), yes(e.Moving)})
	}
	return t
}

func (h Head) Table() Table {
	first := "none stored"
	if h.FirstStored > 0 {
		first = u(h.FirstStored)
	}
	rows := [][]string{
		{"conversation", h.ConvID}, {"head", u(h.Head)}, {"next seq", u(h.Head + 1)},
		{"first stored seq", first}, {"partition", strconv.Itoa(int(h.Partition))},
	}
	return Table{Rows: append(rows, citusRows(h.Shard, h.Worker)...)}
}

func (r Placement) Table() Table {
	owner := dash(r.LeaseOwner)
	if r.LeaseOwner != "" && !r.OwnerLive {
		owner += " (dead)"
	}
	rows := [][]string{
		{"conversation", r.ConvID}, {"partition", strconv.Itoa(int(r.Partition))},
		{"membership version", u(r.Version)}, {"ring owner", dash(r.Node)}, {"api address", dash(r.APIAddr)},
		{"cluster address", dash(r.ClusterAddr)}, {"lease owner", owner}, {"epoch", u(r.Epoch)}, {"moving", yes(r.Moving)},
	}
	return Table{Rows: append(rows, citusRows(r.Shard, r.Worker)...)}
}

// citusRows are a conversation's shard and worker on Citus (none elsewhere).
func citusRows(shard int64, worker string) [][]string {
	if worker == "" {
		return nil
	}
	return [][]string{{"citus shard", strconv.FormatInt(shard, 10)}, {"citus worker", worker}}
}

func (f Forgot) Table() Table {
	return Table{Lines: []string{fmt.Sprintf("forgot %s (incarnation %s, lease was live: %s); membership version now %d",
		f.NodeID, f.Incarnation, yes(f.WasLive), f.Version)}}
}

func (d Drained) Table() Table {
	if d.Left {
		t := Table{Lines: []string{fmt.Sprintf("%s (incarnation %s) left the cluster; membership version %d", d.NodeID, d.Incarnation, d.Version)}}
		if d.Rejoined != "" {
			t.Lines = append(t.Lines, fmt.Sprintf("but %s is a member again as incarnation %s (restarted or rejoined): not drained; drain it again, or stop its supervisor", d.NodeID, d.Rejoined))
		}
		return t
	}
	return Table{Lines: []string{fmt.Sprintf("drain requested: %s (incarnation %s) is out of the ring and leaves at its next heartbeat; membership version %d",
		d.NodeID, d.Incarnation, d.Version)}}
}

func (m MigrationStatus) Table() Table {
	state := "up to date"
	if !m.UpToDate {
		state = "pending migrations (run `sequencer migrate`, or start a node of this version)"
	}
	t := Table{Lines: []string{fmt.Sprintf("%s store: applied version %d, this binary has %d: %s", m.Store, m.Applied, m.Available, state)},
		Header: []string{"VERSION", "NAME", "STATE", "APPLIED AT"}}
	for _, r := range m.Migrations {
		at := "-"
		if r.AppliedAt != nil {
			at = ts(*r.AppliedAt)
		}
		t.Rows = append(t.Rows, []string{strconv.Itoa(r.Version), r.Name, r.State, at})
	}
	return t
}

func (t Trimmed) Table() Table {
	return Table{Lines: []string{fmt.Sprintf("deleted %d messages with server_at before %s (%d ms); heads kept", t.Deleted, ts(t.Before), t.TookMs)}}
}

func (b BackedUp) Table() Table {
	return Table{Lines: []string{fmt.Sprintf("backed up to %s (%d bytes)", b.To, b.Bytes)}}
}
