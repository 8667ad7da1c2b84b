package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
)

// With --subs-process the feed engines' Subscribe streams run in a child
// process of the bench (`sequencer-bench subscribers`), so the process of
// the 1,024 senders does not also receive 10,000 streams: the write rate
// then measures the server, not a client process starved by its own
// subscribers. The child speaks lines on its stdin and stdout:
//
//	child:  ready N                 (N streams, each got its seed message)
//	parent: start                   (count from now)
//	parent: stats                   (stop counting)
//	child:  delivered N COUNT
//
// and ends its streams when its stdin closes. The feed's latency is not
// measured then (the Sends' answers are in the other process).

// subsChild is a running `sequencer-bench subscribers`.
type subsChild struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	n   int
}

func startSubsChild(ctx context.Context, target, convPfx string, convs, perStream int, cpuProfile string) (*subsChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "subscribers", "--target", target, "--prefix", convPfx, "--convs", fmt.Sprint(convs), "--convs-per-stream", fmt.Sprint(max(perStream, 1)))
	if cpuProfile != "" {
		cmd.Args = append(cmd.Args, "--cpuprofile", cpuProfile)
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &subsChild{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	ready := make(chan error, 1)
	go func() {
		_, err := fmt.Sscanf(c.line(), "ready %d", &c.n)
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("subscribers' process: %w", err)
	}
	return c, nil
}

func (c *subsChild) line() string {
	if c.out.Scan() {
		return c.out.Text()
	}
	return ""
}

func (c *subsChild) start() { fmt.Fprintln(c.in, "start") }

// stats stops the count and returns the streams and what they received.
func (c *subsChild) stats() (streams int, delivered int64) {
	fmt.Fprintln(c.in, "stats")
	if _, err := fmt.Sscanf(c.line(), "delivered %d %d", &streams, &delivered); err != nil {
		fmt.Fprintf(os.Stderr, "sequencer-bench: subscribers' process: no stats: %v\n", err)
	}
	return streams, delivered
}

func (c *subsChild) close() {
	c.in.Close()
	_ = c.cmd.Wait()
}

// subscribersMain is the child: a stream per conversation PREFIX0 ..
// PREFIX<convs-1> (or per --convs-per-stream of them), counting what they
// receive between start and stats.
func subscribersMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFeedFlags("subscribers", stderr)
	pfx := fs.String("prefix", "", "conversation id prefix (the bench's run and scenario)")
	convs := fs.Int("convs", 0, "conversations")
	perStream := fs.Int("convs-per-stream", 1, "conversations per Subscribe stream")
	base, help, err := fs.parse(args)
	if help {
		return nil
	} else if err != nil {
		return err
	}
	if *convs <= 0 {
		return errors.New("--convs must be > 0")
	}
	stopProfile, err := fs.profile()
	if err != nil {
		return err
	}
	defer stopProfile()
	var counting atomic.Bool
	var got atomic.Int64
	streams, err := openFeedStreams(ctx, base, *pfx, *convs, *perStream, func(int, uint64) {
		if counting.Load() {
			got.Add(1)
		}
	})
	if err != nil {
		return err
	}
	defer streams.Close()
	fmt.Fprintf(stdout, "ready %d\n", streams.n)
	in := bufio.NewScanner(stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "start":
			got.Store(0)
			counting.Store(true)
		case "stats":
			counting.Store(false)
			fmt.Fprintf(stdout, "delivered %d %d\n", streams.n, got.Load())
		}
	}
	return nil
}
