package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sequencer-im/sequencer/bench"
)

func benchCmd(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return bench.Main(ctx, args, stdout, stderr)
}
