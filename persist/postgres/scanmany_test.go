package postgres

import (
	"encoding/binary"
	"testing"
	"time"
)

// pgTime decodes binary timestamptz values as pgx does, on both sides of
// PostgreSQL's epoch, and refuses the infinities.
func TestPgTimeDecodesBinaryTimestamps(t *testing.T) {
	enc := func(us int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(us)) }
	epoch := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, want := range []time.Time{
		epoch,
		epoch.Add(-500 * time.Millisecond),
		epoch.Add(-time.Microsecond),
		time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 5, 10, 20, 30, 123_000_000, time.UTC),
	} {
		got, err := pgTime(enc(want.Sub(epoch).Microseconds()))
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Fatalf("pgTime(%v) = %v, %v", want, got, err)
		}
	}
	for _, us := range []int64{1<<63 - 1, -1 << 63} {
		if _, err := pgTime(enc(us)); err == nil {
			t.Fatalf("pgTime(%d): no error for an infinite timestamp", us)
		}
	}
}
