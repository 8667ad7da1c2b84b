package conf

import "strconv"

// Not is a bool flag.Value that stores its negation: a flag whose default
// is true (`--send-marks-read`) sets a Config field whose zero value, false,
// is that default (commit.Config.KeepReadPositions).
type Not struct{ B *bool }

func (f Not) String() string {
	if f.B == nil {
		return "true"
	}
	return strconv.FormatBool(!*f.B)
}

// Set parses v as a bool and stores its negation.
func (f Not) Set(v string) error {
	on, err := strconv.ParseBool(v)
	if err != nil {
		return err
	}
	*f.B = !on
	return nil
}

// IsBoolFlag lets the flag stand alone (--send-marks-read means true).
func (f Not) IsBoolFlag() bool { return true }
