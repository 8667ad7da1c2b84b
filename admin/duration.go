package admin

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseDuration reads a retention length: a Go duration ("36h", "90m") or
// a whole number of days with a d suffix ("90d"), optionally followed by a Go
// duration ("1d12h"). "0" is zero.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" || s == "" {
		return 0, nil
	}
	var days int64
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || n < 0 || n > 100_000 {
			return 0, fmt.Errorf("duration %q: want a number of days before 'd' (e.g. 90d) or a Go duration (e.g. 36h)", s)
		}
		days, s = n, s[i+1:]
	}
	var rest time.Duration
	if s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("duration: %w (days are written 90d)", err)
		}
		rest = d
	}
	d := time.Duration(days)*24*time.Hour + rest
	if d < 0 {
		return 0, fmt.Errorf("duration %q is negative", s)
	}
	return d, nil
}

// Duration is a flag.Value for ParseDuration's spelling.
type Duration struct{ D *time.Duration }

func (d Duration) String() string {
	if d.D == nil || *d.D == 0 {
		return "0"
	}
	if *d.D%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", *d.D/(24*time.Hour))
	}
	return d.D.String()
}

func (d Duration) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d.D = v
	return nil
}
