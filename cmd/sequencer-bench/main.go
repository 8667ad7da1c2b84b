// Command sequencer-bench measures this sequencer against the seed's ways of
// numbering messages (package bench; docs/BENCHMARKS.md). It is its own
// binary so that `sequencer serve` does not link the baselines' clients
// (go-redis); `sequencer bench ARGS` runs it when it sits next to the
// sequencer binary (make build puts both into bin/).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sequencer-im/sequencer/cmd/sequencer-bench/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := bench.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sequencer-bench: %v\n", err)
		os.Exit(1)
	}
}
