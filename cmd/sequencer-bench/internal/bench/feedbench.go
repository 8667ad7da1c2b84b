package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/client"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// The change feed's benches that are not a write load (issue 33), run
// against a running `sequencer serve` (--target):
//
//	sequencer-bench fanout --target URL [--subs 1000] [--pubs 8] [--duration 10s] [--json]
//	sequencer-bench pullmany --target URL [--convs 1000] [--msgs 10] [--limit N] [--calls 50] [--gzip]
//
// Both take --cpuprofile FILE (this process: the subscribers or the caller).
//
// fanout is the anchor's measurement (../shared/peers/centrifugo/main.go)
// done on the feed: N Subscribe streams on one conversation, all in this
// process, and P publishers sending to it (SDK unary Sends) as fast as
// they can for D; it reports publications/s, deliveries/s and the latency
// from just before the Send to the receipt (in the message body), sampled
// on one subscriber in 20, as the anchor does.
//
// pullmany stores msgs messages in each of convs conversations, then makes
// calls PullMany calls of every conversation from seq 0 (each returns all
// of them) and reports the call latency's p50 and p99.

// feedMain runs a feed bench when args name one; ok false: not one.
func feedMain(ctx context.Context, args []string, stdout, stderr io.Writer) (ok bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case "fanout":
		return true, fanoutMain(ctx, args[1:], stdout, stderr)
	case "pullmany":
		return true, pullManyMain(ctx, args[1:], stdout, stderr)
	case "subscribers":
		return true, subscribersMain(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	return false, nil
}

// h2c returns an HTTP/2 cleartext client: one connection.
func h2c() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

// feedFlags is a feed bench's flag set, with --target.
type feedFlags struct {
	*flag.FlagSet
	target     *string
	cpuProfile *string
}

func newFeedFlags(name string, stderr io.Writer) feedFlags {
	fs := flag.NewFlagSet("sequencer-bench "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return feedFlags{fs, fs.String("target", "", "base URL of a running 'sequencer serve', e.g. http://127.0.0.1:7070 (required)"),
		fs.String("cpuprofile", "", "write this process's CPU profile (the subscribers' or callers' side) to this file")}
}

// profile starts the CPU profile --cpuprofile asked for; stop ends it.
func (f feedFlags) profile() (stop func(), err error) {
	if *f.cpuProfile == "" {
		return func() {}, nil
	}
	out, err := os.Create(*f.cpuProfile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); out.Close() }, nil
}

// parse parses args and returns the target; help true: -h was asked.
func (f feedFlags) parse(args []string) (base string, help bool, err error) {
	if err := f.Parse(args); err != nil {
		return "", errors.Is(err, flag.ErrHelp), err
	}
	if *f.target == "" {
		return "", false, errors.New("--target is required")
	}
	return strings.TrimRight(*f.target, "/"), false, nil
}

func fanoutMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFeedFlags("fanout", stderr)
	subs := fs.Int("subs", 1000, "Subscribe streams on the one conversation")
	pubs := fs.Int("pubs", 8, "concurrent publishers (SDK unary Sends)")
	dur := fs.Duration("duration", 10*time.Second, "publishing time")
	perConn := fs.Int("streams-per-conn", 100, "Subscribe streams sharing one HTTP/2 connection")
	asJSON := fs.Bool("json", false, "subscribers speak Connect with JSON (default: gRPC, binary protobuf)")
	base, help, err := fs.parse(args)
	if help {
		return nil
	} else if err != nil {
		return err
	}
	stopProfile, err := fs.profile()
	if err != nil {
		return err
	}
	defer stopProfile()
	conv := "fanout-" + randomID()
	opts := []connect.ClientOption{connect.WithGRPC()}
	if *asJSON {
		opts = []connect.ClientOption{connect.WithProtoJSON()}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var delivered atomic.Int64
	var latMu sync.Mutex
	var lats []time.Duration
	var ready, done sync.WaitGroup
	var hc *http.Client
	for i := 0; i < *subs; i++ {
		if i%*perConn == 0 {
			hc = h2c()
		}
		c := sequencerv1connect.NewSequencerServiceClient(hc, base, opts...)
		st, err := c.Subscribe(sctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: []*sequencerv1.Cursor{{ConvId: conv}}}))
		if err != nil {
			return fmt.Errorf("subscribe %d: %w", i, err)
		}
		sample := i%20 == 0
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			defer st.Close()
			first := true
			for st.Receive() {
				m := st.Msg().GetMessage()
				if m == nil {
					continue
				}
				if first { // the seeding message: attached
					first = false
					ready.Done()
					continue
				}
				delivered.Add(1)
				if sample && len(m.GetBody()) >= 8 {
					l := time.Since(time.Unix(0, int64(binary.BigEndian.Uint64(m.GetBody()))))
					latMu.Lock()
					lats = append(lats, l)
					latMu.Unlock()
				}
			}
			if first {
				ready.Done()
			}
		}()
	}
	pc, err := client.New(client.Config{Addrs: []string{base}, DisableRouting: true, Batching: client.BatchPolicy{Disabled: true}})
	if err != nil {
		return err
	}
	defer pc.Close()
	if _, err := pc.Send(ctx, client.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: conv + "-seed", Body: []byte("seed")}); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	ready.Wait()
	fmt.Fprintf(stdout, "%d subscribers subscribed (%d per HTTP/2 connection, %s)\n", *subs, *perConn, map[bool]string{false: "gRPC", true: "Connect JSON"}[*asJSON])
	delivered.Store(0)
	var published atomic.Int64
	start := time.Now()
	stop := start.Add(*dur)
	var wg sync.WaitGroup
	for p := 0; p < *pubs; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(stop); n++ {
				body := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
				if _, err := pc.Send(ctx, client.SendRequest{ConvID: conv, FromUID: uint64(p + 1), ClientMsgID: fmt.Sprintf("%s-p%d-%d", conv, p, n), Body: body}); err == nil {
					published.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	pubEnd := time.Now()
	want := published.Load() * int64(*subs)
	for i := 0; i < 100 && delivered.Load() < want; i++ {
		time.Sleep(100 * time.Millisecond) // let the deliveries drain, as the anchor does
	}
	el, pel := time.Since(start).Seconds(), pubEnd.Sub(start).Seconds()
	latMu.Lock()
	slices.Sort(lats)
	q := func(f float64) time.Duration {
		if len(lats) == 0 {
			return 0
		}
		return lats[int(f*float64(len(lats)-1))]
	}
	fmt.Fprintf(stdout, "published %d in %.1fs (%.0f/s); delivered %d of %d (%.0f deliveries/s over %.1fs); latency p50 %v p99 %v max %v (sampled %d)\n",
		published.Load(), pel, float64(published.Load())/pel, delivered.Load(), want, float64(delivered.Load())/el, el,
		q(0.5).Round(100*time.Microsecond), q(0.99).Round(100*time.Microsecond), q(1).Round(time.Millisecond), len(lats))
	latMu.Unlock()
	cancel()
	done.Wait()
	return nil
}

func pullManyMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFeedFlags("pullmany", stderr)
	convs := fs.Int("convs", 1000, "conversations per PullMany (at most 1,000)")
	msgs := fs.Int("msgs", 10, "messages stored in each conversation, all returned by each call")
	calls := fs.Int("calls", 50, "PullMany calls measured (after 5 unmeasured)")
	bodySize := fs.Int("body", 128, "message body size in bytes")
	gz := fs.Bool("gzip", false, "ask for gzipped answers (the SDK's Config.Gzip)")
	limit := fs.Int("limit", 0, "PullMany's per-conversation limit (0: --msgs); the first call's latency is printed too: start a fresh node to see a new connection's")
	base, help, err := fs.parse(args)
	if help {
		return nil
	} else if err != nil {
		return err
	}
	stopProfile, err := fs.profile()
	if err != nil {
		return err
	}
	defer stopProfile()
	c, err := client.New(client.Config{Addrs: []string{base}, DisableRouting: true, Gzip: *gz})
	if err != nil {
		return err
	}
	defer c.Close()
	pfx := "pullmany-" + randomID() + "-"
	body := make([]byte, *bodySize)
	var reqs []client.SendRequest
	for k := 0; k < *convs; k++ {
		for s := 0; s < *msgs; s++ {
			reqs = append(reqs, client.SendRequest{ConvID: convID(pfx, k), FromUID: 1, ClientMsgID: fmt.Sprintf("%s%d-%d", pfx, k, s), Body: body})
		}
	}
	for len(reqs) > 0 {
		n := min(len(reqs), seedChunk)
		if _, errs := c.SendMany(ctx, reqs[:n]); firstErr(errs) != nil {
			return fmt.Errorf("seed: %w", firstErr(errs))
		}
		reqs = reqs[n:]
	}
	cursors := make([]client.Cursor, *convs)
	for k := range cursors {
		cursors[k] = client.Cursor{ConvID: convID(pfx, k)}
	}
	if *limit <= 0 {
		*limit = *msgs
	}
	var took []time.Duration
	var first time.Duration
	got := 0
	// CPU per measured call: this process's (the SDK: receive, gunzip,
	// decode) and the server's (its /metrics, when it serves them).
	srv := &remoteEngine{base: base, http: &http.Client{}}
	var ownCPU0, srvCPU0 float64
	var srvErr error
	for i := 0; i < *calls+5; i++ {
		if i == 5 {
			ownCPU0, _ = procCPUSeconds(os.Getpid())
			srvCPU0, srvErr = srv.CPUSeconds(ctx)
		}
		t0 := time.Now()
		pages, err := c.PullMany(ctx, cursors, *limit, 64<<20)
		d := time.Since(t0)
		if i == 0 {
			first = d
		}
		if err != nil {
			return fmt.Errorf("pull many: %w", err)
		}
		got = 0
		for _, p := range pages {
			got += len(p.Messages)
		}
		if i >= 5 {
			took = append(took, d)
		}
	}
	ownCPU, _ := procCPUSeconds(os.Getpid())
	srvCPU := "not read"
	if srvErr == nil {
		if v, err := srv.CPUSeconds(ctx); err == nil {
			srvCPU = fmt.Sprintf("%.1f ms", (v-srvCPU0)*1000/float64(len(took)))
		}
	}
	slices.Sort(took)
	fmt.Fprintf(stdout, "PullMany of %d conversations x %d messages (%d returned per call, %d-byte bodies): %d calls, p50 %v, p99 %v (the first, unmeasured: %v); CPU per call: server %s, this client %.1f ms\n",
		*convs, *msgs, got, *bodySize, len(took), took[len(took)/2].Round(10*time.Microsecond), took[(len(took)-1)*99/100].Round(10*time.Microsecond), first.Round(10*time.Microsecond),
		srvCPU, (ownCPU-ownCPU0)*1000/float64(len(took)))
	return nil
}
