package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOncePerCausePerInterval(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	for range 1000 {
		l.Warn("store", "store down")
		l.Error("fence", "fenced")
	}
	out := buf.String()
	if n := strings.Count(out, "store down"); n != 1 {
		t.Fatalf("store cause logged %d times:\n%s", n, out)
	}
	if n := strings.Count(out, "fenced"); n != 1 || !strings.Contains(out, "level=ERROR") {
		t.Fatalf("fence cause logged %d times:\n%s", n, out)
	}
	l.every = 0 // the interval passed
	l.Warn("store", "store down again")
	if !strings.Contains(buf.String(), "suppressed_since_last=999") {
		t.Fatalf("suppressed count missing:\n%s", buf.String())
	}
}
