package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/console"
	"github.com/sequencer-im/sequencer/firehose"
	"github.com/sequencer-im/sequencer/firehose/natssink"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
)

// FirehoseConfig is the firehose to NATS JetStream (docs/FEED.md). Off when
// URL is empty. Its values are checked when the node starts (a bad one is
// exit 1 with what to do): the URL, that a stream covers the subjects (or
// its creation with CreateStream), the format.
type FirehoseConfig struct {
	URL          string // --feed-nats: nats://HOST:PORT (several comma-separated; tls:// for TLS)
	Subject      string // --feed-subject: the subjects' prefix, PREFIX.<partition>
	Format       string // --feed-format: proto or json
	CreateStream bool   // --feed-create-stream
	CredsFile    string // --feed-nats-creds: NATS credentials file
	CAFile       string // --feed-nats-ca: CA of the NATS server's certificate
	CertFile     string // --feed-nats-cert: client certificate for NATS (with --feed-nats-key)
	KeyFile      string // --feed-nats-key
}

// tee hands committed batches to several publishers (the change feed's hub
// and the firehose).
type tee []actor.Publisher

func (t tee) Publish(convID string, msgs []sequencer.Message) {
	for _, p := range t {
		p.Publish(convID, msgs)
	}
}

// firehoseRun is a running firehose: stop ends it (storing the cursors it
// owes) and closes the broker connection.
type firehoseRun struct {
	pub  *firehose.Publisher
	sink *natssink.Sink
	stop func()
}

// openFirehose connects to NATS and checks the stream; nil when the
// firehose is off.
func (s *Server) openFirehose(ctx context.Context, st persist.Store) (*firehoseRun, error) {
	fc := s.cfg.Firehose
	if fc.URL == "" {
		return nil, nil
	}
	ob, ok := st.(persist.Outbox)
	if !ok {
		return nil, errors.New("--feed-nats: this store has no outbox")
	}
	if _, err := ob.OutboxPending(ctx, 0, "", 1); err != nil {
		return nil, fmt.Errorf("--feed-nats: reading the outbox: %w (run `sequencer migrate`?)", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sink, err := natssink.Open(cctx, natssink.Config{URL: fc.URL, Subject: fc.Subject, Format: fc.Format,
		CreateStream: fc.CreateStream, CredsFile: fc.CredsFile, CAFile: fc.CAFile, CertFile: fc.CertFile, KeyFile: fc.KeyFile,
		Name: s.cfg.NodeID})
	if err != nil {
		return nil, err
	}
	stream, created := sink.Stream()
	s.log.Info("firehose: publishing to NATS JetStream", "stream", stream, "created", created,
		"subjects", fc.Subject+".<partition>", "format", fc.Format)
	cfg := firehose.Config{Store: storeOf{st, ob}, Sink: sink, Logger: s.log,
		Core: firehose.CoreConfig{Partitions: s.cfg.Cluster.Ring.Partitions}, ObserveLag: s.metrics.FeedPublishLag()}
	pub, err := firehose.New(cfg)
	if err != nil {
		sink.Close()
		return nil, err
	}
	return &firehoseRun{pub: pub, sink: sink}, nil
}

// storeOf is a persist.Store with its outbox, as firehose.Store.
type storeOf struct {
	persist.Store
	persist.Outbox
}

// start runs the publisher on the partitions c holds (every partition when
// c is nil: no cluster).
func (f *firehoseRun) start(c *cluster.Node, m *metrics.Set) {
	if c != nil {
		f.pub.SetOwned(func() []firehose.Holding {
			ls := c.HeldLeases()
			out := make([]firehose.Holding, len(ls))
			for i, l := range ls {
				out[i] = firehose.Holding{Partition: l.Partition, Epoch: l.Epoch}
			}
			return out
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.pub.Run(ctx) }()
	f.stop = func() { cancel(); wg.Wait(); f.sink.Close() }
	m.Firehose(func() metrics.FeedStats {
		st := f.pub.Stats()
		out := metrics.FeedStats{LagMessages: st.Messages, Published: st.Published, PublishErrors: st.PublishErrors,
			StoreErrors: st.StoreErrors, Skipped: st.Skipped, Publishing: st.Publishing}
		if !st.Oldest.IsZero() {
			out.LagSeconds = max(0, time.Since(st.Oldest).Seconds())
		}
		return out
	})
}

// close stops the firehose (nil-safe).
func (f *firehoseRun) close() {
	if f == nil {
		return
	}
	if f.stop != nil {
		f.stop()
		return
	}
	f.sink.Close()
}

// consoleState is the console's firehose card.
func (f *firehoseRun) consoleState() console.Firehose {
	st := f.pub.Stats()
	out := console.Firehose{Publishing: st.Publishing, LagMessages: st.Messages, Published: st.Published,
		Errors: st.PublishErrors, Partitions: len(st.PerPartition)}
	if !st.Oldest.IsZero() {
		out.LagSeconds = max(0, time.Since(st.Oldest).Seconds())
	}
	for p, n := range st.PerPartition {
		if n > 0 {
			out.Behind = append(out.Behind, console.FirehosePartition{Partition: p, Messages: n})
		}
	}
	slices.SortFunc(out.Behind, func(a, b console.FirehosePartition) int {
		if a.Messages != b.Messages {
			return cmp.Compare(b.Messages, a.Messages)
		}
		return cmp.Compare(a.Partition, b.Partition)
	})
	if len(out.Behind) > 10 {
		out.Behind = out.Behind[:10]
	}
	return out
}
