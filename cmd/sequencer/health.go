package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

// health is a probe for places without curl or a shell (the container image is
// FROM scratch): GET --url and exit 0 on 200, else 1.
func health(args []string, stdout, stderr io.Writer, _ func(string) string) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:7070/readyz", "endpoint to probe: a node's /readyz (ready for sends) or /healthz (process up)")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "sequencer health [flags]: exit 0 when --url answers 200, else 1 (container health checks)\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", *url, resp.Status, body)
	}
	fmt.Fprintf(stdout, "%s: %s\n", *url, resp.Status)
	return nil
}
