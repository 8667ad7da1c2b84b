package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/history"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// storeKind is one of the stores every end-to-end case runs on.
type storeKind struct {
	name string
	// spec returns a fresh --store value for one test.
	spec func(t *testing.T) string
}

var stores = []storeKind{
	{"embedded", func(t *testing.T) string { return filepath.Join(t.TempDir(), "data") }},
	{"postgres", func(t *testing.T) string { return pgtest.NewDatabase(t) }},
	{"mysql", func(t *testing.T) string { return mysqltest.NewDatabase(t) }},
}

func eachStore(t *testing.T, f func(t *testing.T, spec string)) {
	for _, sk := range stores {
		t.Run(sk.name, func(t *testing.T) { f(t, sk.spec(t)) })
	}
}

// openStore opens the store a (stopped or running) node used, for checks.
func openStore(t *testing.T, spec string) persist.Store {
	t.Helper()
	st, err := open.Store(context.Background(), spec, open.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestJSONContract(t *testing.T) {
	n := startNode(t, "node", "--store", filepath.Join(t.TempDir(), "data"))
	code, body := postJSON(t, n.Addr, "Send", `{"convId":"g:42","fromUid":"1001","clientMsgId":"5f0c-1","body":"aGk="}`)
	if code != 200 {
		t.Fatalf("send: %d %s", code, body)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(body), &first); err != nil {
		t.Fatal(err)
	}
	msgID, ok := first["msgId"].(string)
	if !ok || msgID == "" || first["seq"] != "1" {
		t.Fatalf("msgId must be a decimal string and seq \"1\": %s", body)
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(first["serverAt"])); err != nil {
		t.Fatalf("serverAt not RFC 3339: %s", body)
	}
	// The resend gets the first ids and duplicate: true.
	code, body = postJSON(t, n.Addr, "Send", `{"convId":"g:42","fromUid":"1001","clientMsgId":"5f0c-1","body":"aGk="}`)
	var again map[string]any
	_ = json.Unmarshal([]byte(body), &again)
	if code != 200 || again["msgId"] != msgID || again["seq"] != "1" || again["duplicate"] != true || again["serverAt"] != first["serverAt"] {
		t.Fatalf("resend: %d %s, first %v", code, body, first)
	}
	// The same key in another conversation is already_exists (409), no seq.
	code, body = postJSON(t, n.Addr, "Send", `{"convId":"g:43","fromUid":"1001","clientMsgId":"5f0c-1","body":"aGk="}`)
	if code != 409 || !strings.Contains(body, "already_exists") {
		t.Fatalf("cross-conversation reuse: %d %s", code, body)
	}
	code, body = postJSON(t, n.Addr, "GetHead", `{"convId":"g:43"}`)
	if code != 200 || strings.Contains(body, "headSeq\":\"1") {
		t.Fatalf("g:43 must have no seq: %d %s", code, body)
	}
	code, body = postJSON(t, n.Addr, "Send", `{"convId":"g:42","fromUid":"1001","clientMsgId":"5f0c-2","body":"aGk="}`)
	if code != 200 || !strings.Contains(body, `"seq":"2"`) {
		t.Fatalf("second message: %d %s", code, body)
	}
	code, body = postJSON(t, n.Addr, "Pull", `{"convId":"g:42","afterSeq":"1"}`)
	if code != 200 || !strings.Contains(body, `"seq":"2"`) || strings.Contains(body, `"seq":"1"`) || !strings.Contains(body, `"headSeq":"2"`) {
		t.Fatalf("pull after 1: %d %s", code, body)
	}
	code, body = postJSON(t, n.Addr, "GetMessage", fmt.Sprintf(`{"msgId":%q}`, msgID))
	if code != 200 || !strings.Contains(body, `"clientMsgId":"5f0c-1"`) || !strings.Contains(body, `"body":"aGk="`) {
		t.Fatalf("get message: %d %s", code, body)
	}
	code, body = postJSON(t, n.Addr, "GetMessage", `{"msgId":"12345"}`)
	if code != 404 || !strings.Contains(body, "not_found") {
		t.Fatalf("unknown msg_id: %d %s", code, body)
	}
	code, body = postJSON(t, n.Addr, "Route", `{"convId":"g:42"}`)
	if code != 200 || !strings.Contains(body, "nodeId") {
		t.Fatalf("route: %d %s", code, body)
	}
	// /metrics exposes what an operator needs to see those sends.
	resp, err := http.Get("http://" + n.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sequencer_sends_total{code="ok"} 2`, `sequencer_sends_total{code="duplicate"} 1`,
		`sequencer_sends_total{code="already_exists"} 1`, `sequencer_dedup_hits_total 1`,
		`sequencer_commit_batch_messages_count`, `sequencer_commit_seconds_bucket{result="ok"`,
		`sequencer_conversation_actors`, `sequencer_passivations_total`,
		`sequencer_clock_rollbacks_total{outcome="refused"} 0`, `sequencer_worker_lease_held 1`,
	} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestValidationConsumesNoSeq(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		n := startNode(t, "node", "--store", spec)
		long := strings.Repeat("x", 65)
		bigBody := strings.Repeat("A", 65537*4/3+4) // base64 of > 65,536 bytes
		cases := map[string]string{
			"empty conv_id":         `{"convId":"","fromUid":"1","clientMsgId":"a"}`,
			"conv_id 65 bytes":      `{"convId":"` + long + `","fromUid":"1","clientMsgId":"a"}`,
			"conv_id control char":  `{"convId":"c\u0007","fromUid":"1","clientMsgId":"a"}`,
			"from_uid 0":            `{"convId":"c","fromUid":"0","clientMsgId":"a"}`,
			"from_uid 2^63":         `{"convId":"c","fromUid":"9223372036854775808","clientMsgId":"a"}`,
			"empty client_msg_id":   `{"convId":"c","fromUid":"1","clientMsgId":""}`,
			"client_msg_id 65":      `{"convId":"c","fromUid":"1","clientMsgId":"` + long + `"}`,
			"client_msg_id control": `{"convId":"c","fromUid":"1","clientMsgId":"a\n"}`,
			"msg_type negative":     `{"convId":"c","fromUid":"1","clientMsgId":"a","msgType":-1}`,
			"msg_type 32768":        `{"convId":"c","fromUid":"1","clientMsgId":"a","msgType":32768}`,
			"body too large":        `{"convId":"c","fromUid":"1","clientMsgId":"a","body":"` + bigBody + `"}`,
		}
		for name, req := range cases {
			code, body := postJSON(t, n.Addr, "Send", req)
			if code != 400 || !strings.Contains(body, "invalid_argument") {
				t.Errorf("%s: got %d %s, want 400 invalid_argument", name, code, body)
			}
		}
		// Nothing consumed a seq: the first valid send in "c" gets seq 1.
		code, body := postJSON(t, n.Addr, "Send", `{"convId":"c","fromUid":"1","clientMsgId":"a","msgType":32767}`)
		if code != 200 || !strings.Contains(body, `"seq":"1"`) {
			t.Fatalf("first valid send: %d %s", code, body)
		}
	})
}

// load runs `clients` senders over convs until stop is closed or each sent
// `perClient` messages. A share of sends is resent (sequentially, and
// concurrently from a second goroutine) with the same client_msg_id.
// Retryable errors are retried with the same client_msg_id until ctx ends.
type load struct {
	convs     []string
	clients   int
	perClient int
	led       *ledger
	errs      atomic.Int64 // errors after which the client gave up on a message
	retries   atomic.Int64
	onError   func(err error)
	clientFor func(i int) sequencerv1connect.SequencerServiceClient
	// sendFn, when set, replaces clientFor: one attempt of client i.
	sendFn func(ctx context.Context, i int, conv string, from uint64, cid string, body []byte) (msgID, seq uint64, err error)
	// retryable, when set, replaces the default classification.
	retryable  func(err error) bool
	maxLatency atomic.Int64 // ns, longest time from first attempt to ack
	// readers, when > 0, run beside the senders: GetHead and Pull of random
	// conversations through readVia, recorded in the ledger's history (a
	// head that goes backwards or a read that misses an ack fails verify).
	readers int
	readVia func(rng *rand.Rand) (node string, c sequencerv1connect.SequencerServiceClient)
	// convsFor, when set, is the conversations client i sends to (a subset
	// of convs); nil: all of convs.
	convsFor func(i int) []string
}

// read runs one reader until stop.
func (l *load) read(ctx context.Context, i int, stop <-chan struct{}) {
	rng := rand.New(rand.NewSource(int64(7000 + i)))
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		node, c := l.readVia(rng)
		conv := l.convs[rng.Intn(len(l.convs))]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		op := history.Op{Kind: history.Head, Conv: conv, Node: node, Client: l.clients + i, Call: l.led.hist.Now()}
		var err error
		if rng.Intn(2) == 0 {
			var r *connect.Response[sequencerv1.GetHeadResponse]
			if r, err = c.GetHead(rctx, connect.NewRequest(&sequencerv1.GetHeadRequest{ConvId: conv})); err == nil {
				op.Head = r.Msg.HeadSeq
			}
		} else {
			op.Kind = history.Pull
			op.AfterSeq = uint64(rng.Intn(8))
			var r *connect.Response[sequencerv1.PullResponse]
			if r, err = c.Pull(rctx, connect.NewRequest(&sequencerv1.PullRequest{ConvId: conv, AfterSeq: op.AfterSeq, Limit: 20})); err == nil {
				for _, m := range r.Msg.Messages {
					op.Keys = append(op.Keys, historyKey(m.FromUid, m.ClientMsgId))
					op.Seqs = append(op.Seqs, m.Seq)
				}
			}
		}
		cancel()
		op.Return = l.led.hist.Now()
		if err != nil {
			op.Outcome, op.Code = history.Failed, connect.CodeOf(err).String()
		}
		l.led.hist.Add(op)
		select {
		case <-time.After(time.Duration(5+rng.Intn(20)) * time.Millisecond):
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (l *load) run(ctx context.Context, t *testing.T, stop <-chan struct{}) {
	var wg sync.WaitGroup
	readStop := make(chan struct{})
	var readers sync.WaitGroup
	for i := 0; i < l.readers; i++ {
		readers.Add(1)
		go func(i int) { defer readers.Done(); l.read(ctx, i, readStop) }(i)
	}
	defer func() { close(readStop); readers.Wait() }()
	for i := 0; i < l.clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var c sequencerv1connect.SequencerServiceClient
			if l.sendFn == nil {
				c = l.clientFor(i)
			}
			rng := rand.New(rand.NewSource(int64(i)))
			from := uint64(1000 + i)
			mine := l.convs
			if l.convsFor != nil {
				mine = l.convsFor(i)
			}
			for j := 0; l.perClient == 0 || j < l.perClient; j++ {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				conv := mine[rng.Intn(len(mine))]
				cid := fmt.Sprintf("c%d-m%d", i, j)
				body := []byte(cid)
				resends := 0
				if rng.Intn(10) == 0 {
					resends = 1
				}
				concurrent := rng.Intn(20) == 0
				var inner sync.WaitGroup
				if concurrent {
					inner.Add(1)
					go func() {
						defer inner.Done()
						l.sendUntilAcked(ctx, i, c, conv, from, cid, body)
					}()
				}
				for k := 0; k <= resends; k++ {
					l.sendUntilAcked(ctx, i, c, conv, from, cid, body)
				}
				inner.Wait()
			}
		}(i)
	}
	wg.Wait()
}

// sendUntilAcked sends until acked or a non-retryable error or ctx end.
func (l *load) sendUntilAcked(ctx context.Context, i int, c sequencerv1connect.SequencerServiceClient, conv string, from uint64, cid string, body []byte) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, l.attemptTimeout())
		var msgID, seq uint64
		var err error
		var dup bool
		call := l.led.hist.Now()
		if l.sendFn != nil {
			msgID, seq, err = l.sendFn(rctx, i, conv, from, cid, body)
		} else {
			var resp *sequencerv1.SendResponse
			if resp, err = send(rctx, c, conv, from, cid, body); err == nil {
				msgID, seq, dup = resp.MsgId, resp.Seq, resp.Duplicate
			}
		}
		cancel()
		code, outcome := sendOutcome(err)
		l.led.hist.Add(history.Op{Kind: history.Send, Conv: conv, Client: i, Key: historyKey(from, cid),
			Call: call, Return: l.led.hist.Now(), Outcome: outcome, Code: code, Seq: seq, MsgID: msgID, Duplicate: dup})
		if err == nil {
			l.led.record(ack{conv: conv, from: from, cid: cid, msgID: msgID, seq: seq})
			took := int64(time.Since(start))
			for {
				cur := l.maxLatency.Load()
				if took <= cur || l.maxLatency.CompareAndSwap(cur, took) {
					break
				}
			}
			return
		}
		if l.onError != nil {
			l.onError(err)
		}
		retry := retryableCode(err)
		if l.retryable != nil {
			retry = l.retryable(err)
		}
		if ctx.Err() != nil || !retry {
			l.errs.Add(1)
			return
		}
		l.retries.Add(1)
		select {
		case <-ctx.Done():
			l.errs.Add(1)
			return
		case <-time.After(time.Duration(10+attempt*10) * time.Millisecond):
		}
	}
}

// attemptTimeout bounds one attempt: 10 s, or 60 s when sendFn retries on
// its own (the SDK has a 30 s budget of its own).
func (l *load) attemptTimeout() time.Duration {
	if l.sendFn != nil {
		return 60 * time.Second
	}
	return 10 * time.Second
}

// sendOutcome classifies one attempt for the history (CONTRACT section 6):
// an error a node answered is final unless it is deadline_exceeded or
// canceled; a transport error tells nothing. The SDK retries inside, so an
// error it surfaces after a retryable code may follow an attempt that stored.
func sendOutcome(err error) (string, history.Outcome) {
	if err == nil {
		return "", history.OK
	}
	var se *sequencer.Error
	if asSeqErr(err, &se) {
		code := se.Code.String()
		if se.Code.Retryable() || se.Code == sequencer.CodeDeadlineExceeded || se.Code == sequencer.CodeCanceled || se.Code == sequencer.CodeInternal {
			return code, history.Unknown
		}
		return code, history.OutcomeOfCode(code, true)
	}
	code := connect.CodeOf(err)
	if code == connect.CodeInternal {
		// As above: "internal" is also what connect reports for a response
		// cut off mid-body (a node killed while answering: "incomplete
		// envelope"), which tells nothing.
		return code.String(), history.Unknown
	}
	return code.String(), history.OutcomeOfCode(code.String(), connect.IsWireError(err))
}

// retryableCode is what a client may resend on (with the same client_msg_id).
func retryableCode(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeDeadlineExceeded, connect.CodeUnknown, connect.CodeCanceled:
		return true
	}
	return false
}

func convNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("conv-%03d", i)
	}
	return out
}

func TestConcurrentClientsAndResends(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		n := startNode(t, "node", "--store", spec)
		convs := convNames(120)
		l := &load{convs: convs, clients: 64, perClient: 25, led: newLedger(),
			clientFor: func(i int) sequencerv1connect.SequencerServiceClient {
				if i%2 == 0 {
					return n.grpcClient()
				}
				return n.jsonClient()
			}}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		l.run(ctx, t, nil)
		if l.errs.Load() != 0 {
			t.Fatalf("%d sends failed for good", l.errs.Load())
		}
		if got, want := l.led.count(), 64*25; got != want {
			t.Fatalf("acked %d distinct messages, want %d", got, want)
		}
		if err := n.term(30 * time.Second); err != nil {
			t.Fatalf("SIGTERM: %v\n%s", err, n.Output())
		}
		l.led.verify(t, openStore(t, spec), convs)
	})
}

func TestKill9MidLoadThenRestart(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		n := startNode(t, "node", "--store", spec)
		convs := convNames(100)
		l := &load{convs: convs, clients: 64, led: newLedger(),
			clientFor: func(int) sequencerv1connect.SequencerServiceClient { return n.grpcClient() }}
		ctx, cancel := context.WithCancel(context.Background())
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { l.run(ctx, t, stop); close(done) }()
		waitFor(t, 60*time.Second, "300 acks before the kill", func() bool { return l.led.count() >= 300 })
		n.kill()
		close(stop)
		cancel() // clients stop; what they were told is in the ledger
		<-done
		before := l.led.count()
		n.start(n.Addr)
		// The next send continues at head+1; then (the embedded store has
		// one owner: the node stops first) every acked message survived.
		c := n.grpcClient()
		for _, conv := range convs[:10] {
			hr, err := c.GetHead(context.Background(), connect.NewRequest(&sequencerv1.GetHeadRequest{ConvId: conv}))
			if err != nil {
				t.Fatal(err)
			}
			head := hr.Msg.GetHeadSeq()
			resp, err := send(context.Background(), c, conv, 7, "after-restart-"+conv, nil)
			if err != nil {
				t.Fatalf("send after restart: %v", err)
			}
			if resp.Seq != head+1 {
				t.Fatalf("conv %s: after restart got seq %d, want head+1 = %d", conv, resp.Seq, head+1)
			}
		}
		if err := n.term(30 * time.Second); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		l.led.verify(t, openStore(t, spec), convs)
		t.Logf("acked before kill -9: %d", before)
	})
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, d, 10*time.Millisecond, what, cond)
}
