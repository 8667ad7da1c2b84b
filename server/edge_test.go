package server

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestConnErrorsAnOperatorNeedNotSee: a client's GOAWAY, a connection it
// closed or reset, are logged at debug; anything else (a failed handshake)
// stays a warning.
func TestConnErrorsAnOperatorNeedNotSee(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	el := httpErrorLog(log, "api")
	for _, line := range []string{
		"http2: received GOAWAY [FrameHeader GOAWAY len=8], starting graceful shutdown",
		"http: TLS handshake error from 127.0.0.1:5555: EOF",
		"read tcp 127.0.0.1:7070->127.0.0.1:5555: read: connection reset by peer",
	} {
		el.Print(line)
	}
	el.Print("http: TLS handshake error from 127.0.0.1:5556: remote error: tls: bad certificate")
	out := buf.String()
	if n := strings.Count(out, "level=WARN"); n != 1 || !strings.Contains(out, "bad certificate") {
		t.Fatalf("want exactly the bad certificate as a warning:\n%s", out)
	}
	if n := strings.Count(out, "level=DEBUG"); n != 3 {
		t.Fatalf("want the three routine errors at debug:\n%s", out)
	}
}
