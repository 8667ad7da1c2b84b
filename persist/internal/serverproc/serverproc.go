// Package serverproc runs the throwaway database servers of the test
// harnesses (persist/pgtest, persist/mysqltest): a child process that the
// kernel stops when the test process dies, waited for until it answers,
// stopped by a signal and then, if it hangs, killed.
package serverproc

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// Proc is a started server process.
type Proc struct {
	Cmd  *exec.Cmd
	Done chan struct{} // closed when the process exited
}

// Start starts cmd as the server name: in a process group of its own, with
// the parent-death signal sig, from a goroutine locked to its OS thread
// (Pdeathsig fires when the forking thread exits, so that thread stays,
// blocked in Wait, as long as the server runs). cmd's other SysProcAttr
// settings (a Credential) are kept. onExit, when not nil, runs once the
// process is gone (or did not start): closing its log file. Start then
// waits until ready returns nil, at most 60 s; if the process exits first,
// the error holds the last lines of logPath.
func Start(name string, cmd *exec.Cmd, sig syscall.Signal, logPath string, ready func() error, onExit func()) (*Proc, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	cmd.SysProcAttr.Setpgid = true
	p := &Proc{Cmd: cmd, Done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer func() {
			if onExit != nil {
				onExit()
			}
			close(p.Done)
		}()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		<-p.Done
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.Done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("%s exited at start: %s", name, LastLines(out, 10))
		default:
		}
		err := ready()
		if err == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.Stop(sig)
			return nil, fmt.Errorf("%s did not answer within 60s: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

// Stop sends sig to the server and waits until it exited; after 30 s it
// kills the process group (SIGKILL).
func (p *Proc) Stop(sig syscall.Signal) {
	if p.Cmd.Process == nil {
		return
	}
	_ = p.Cmd.Process.Signal(sig)
	select {
	case <-p.Done:
	case <-time.After(30 * time.Second):
		p.Kill()
	}
}

// Kill kills the server's process group (SIGKILL) and waits until the
// server exited.
func (p *Proc) Kill() {
	if p.Cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.Done
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// LastLines returns the last n lines of b (a server's log, a tool's
// output), for error messages.
func LastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
