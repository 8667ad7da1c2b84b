package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseProcStatCPU(t *testing.T) {
	// A real line's shape (proc(5)): pid (comm) state ppid pgrp session
	// tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...; the
	// command name may hold spaces and parentheses.
	line := "4242 (seq (serve) x) S 1 4242 4242 0 -1 4194560 18233 0 3 0 1234 567 0 0 20 0 9 0 81234 1462272000 10321 18446744073709551615 1 1 0 0 0 0 0 0 2143420159 0 0 0 17 1 0 0 0 0 0\n"
	got, err := parseProcStatCPU(line)
	if err != nil || got != 1234+567 {
		t.Fatalf("parseProcStatCPU = %d, %v; want 1801 ticks", got, err)
	}
	for _, bad := range []string{"", "4242 seq S 1", "4242 (seq) S 1 2 3", "4242 (seq) S 1 4242 4242 0 -1 4194560 18233 0 3 0 x 567 0 0"} {
		if _, err := parseProcStatCPU(bad); err == nil {
			t.Errorf("parseProcStatCPU(%q) succeeded", bad)
		}
	}
}

// procCPUSeconds reads the real /proc: this process's CPU time grows while
// it works.
func TestProcCPUSecondsReadsThisProcess(t *testing.T) {
	before, err := procCPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if clockTicks() <= 0 {
		t.Fatalf("CLK_TCK %v", clockTicks())
	}
	deadline := time.Now().Add(30 * time.Second)
	x := 0
	for {
		for i := range 1_000_000 {
			x += i ^ x
		}
		now, err := procCPUSeconds(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %v s for 30 s of busy work (x=%d)", now, x)
		}
	}
	if _, err := procCPUSeconds(1 << 30); err == nil || !strings.Contains(err.Error(), "/proc/") {
		t.Errorf("a pid that does not exist: %v", err)
	}
}
