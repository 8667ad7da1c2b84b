package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
)

// benchBinary is the name of the benchmark command (cmd/sequencer-bench).
// The server binary does not link the bench (nor its go-redis baseline);
// `sequencer bench` runs this binary when it sits next to the sequencer
// binary.
const benchBinary = "sequencer-bench"

// benchCmd runs `sequencer-bench ARGS` from the directory of this executable,
// with this process's stdin, stdout and stderr, and exits with its exit code.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locate this executable: %w", err)
	}
	return runBench(filepath.Dir(exe), args, stdout, stderr)
}

// errNoBench says where the benchmark binary was looked for and how to get it.
func errNoBench(dir string) error {
	return fmt.Errorf("the benchmark is its own binary, %s, and there is none in %s; build it with 'make build' (bin/%s) or 'go build -o %s ./cmd/%s', then run it directly or as 'sequencer bench'",
		benchBinary, dir, benchBinary, filepath.Join(dir, benchBinary), benchBinary)
}

// exitCode is a child's non-zero exit status, passed on as this process's.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func runBench(dir string, args []string, stdout, stderr io.Writer) error {
	bin := filepath.Join(dir, benchBinary)
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return errNoBench(dir)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// SIGINT and SIGTERM go to the bench, which stops its run and writes
	// the partial report; this process waits for it.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sig)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sig:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() > 0 {
				return exitCode(ee.ExitCode())
			}
			return err
		}
	}
}
