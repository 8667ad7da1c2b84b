package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/client"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

type batchAnswer struct {
	Results []struct {
		Ok *struct {
			MsgID     string `json:"msgId"`
			Seq       string `json:"seq"`
			Duplicate bool   `json:"duplicate"`
		} `json:"ok"`
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	} `json:"results"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func sendBatchJSON(t *testing.T, addr, body string) (int, batchAnswer) {
	t.Helper()
	status, raw := postJSON(t, addr, "SendBatch", body)
	var a batchAnswer
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		t.Fatalf("SendBatch answer %d %q: %v", status, raw, err)
	}
	return status, a
}

func item(conv, from, cid, body string) string {
	return fmt.Sprintf(`{"convId":%q,"fromUid":%q,"clientMsgId":%q,"body":%q}`, conv, from, cid, body)
}

// SendBatch over JSON on the real binary: request limits, per-item results
// in order, invalid items among good ones, a key twice in one batch, the
// same key with different content, one conversation many times (seqs in
// item order), and a whole batch resent.
func TestSendBatchJSON(t *testing.T) {
	n := startNode(t, "node", "--store", "sqlite:"+filepath.Join(t.TempDir(), "seq.db"), "--max-batch-bytes", "4096")
	addr := n.Addr

	// Request-level limits: invalid_argument, nothing stored.
	if status, a := sendBatchJSON(t, addr, `{"items":[]}`); status != 400 || a.Code != "invalid_argument" {
		t.Fatalf("no items: %d %+v", status, a)
	}
	many := make([]string, 1001)
	for i := range many {
		many[i] = item("g:lim", "1", fmt.Sprint("lim", i), "")
	}
	if status, a := sendBatchJSON(t, addr, `{"items":[`+strings.Join(many, ",")+`]}`); status != 400 || a.Code != "invalid_argument" {
		t.Fatalf("1001 items: %d %+v", status, a)
	}
	big := item("g:lim", "1", "big", strings.Repeat("QUFB", 1500)) // 4,500 body bytes > --max-batch-bytes 4096
	if status, a := sendBatchJSON(t, addr, `{"items":[`+big+`]}`); status != 400 || a.Code != "invalid_argument" {
		t.Fatalf("batch over --max-batch-bytes: %d %+v", status, a)
	}
	if status, raw := postJSON(t, addr, "GetHead", `{"convId":"g:lim"}`); status != 200 || strings.Contains(raw, "headSeq") {
		t.Fatalf("a refused batch stored something: %d %s", status, raw)
	}

	// k0 is stored in g:1 first, so the batch can use it in another
	// conversation (within one batch, which of two conversations wins a
	// shared key is a race, as between two concurrent Sends).
	if status, raw := postJSON(t, addr, "Send", item("g:1", "7", "k0", "aGk=")); status != 200 || !strings.Contains(raw, `"seq":"1"`) {
		t.Fatalf("send k0: %d %s", status, raw)
	}
	items := []string{
		item("g:1", "7", "k1", "aGk="),
		`{"convId":"g:1","fromUid":"0","clientMsgId":"bad","body":"aGk="}`, // invalid from_uid
		item("g:1", "7", "k2", "aGk="),
		item("g:1", "7", "k1", "aGk="), // k1 again in the same batch: a resend
		item("g:2", "7", "k3", "aGk="),
		item("g:9", "7", "k0", "aGk="), // k0 in another conversation
		item("g:1", "7", "k4", "b3RoZXI="),
		item("g:1", "7", "k4", "Y2hhbmdlZA=="), // k4 again with another body
		item("g:1", "7", "k5", "aGk="),
	}
	status, a := sendBatchJSON(t, addr, `{"items":[`+strings.Join(items, ",")+`]}`)
	if status != 200 || len(a.Results) != len(items) {
		t.Fatalf("batch: %d %+v", status, a)
	}
	r := a.Results
	ok := func(i int, seq string, dup bool) {
		t.Helper()
		if r[i].Ok == nil || r[i].Ok.Seq != seq || r[i].Ok.Duplicate != dup {
			t.Fatalf("item %d: %+v %+v, want ok seq %s duplicate %v", i, r[i].Ok, r[i].Error, seq, dup)
		}
	}
	fail := func(i int, code string) {
		t.Helper()
		if r[i].Error == nil || r[i].Error.Code != code {
			t.Fatalf("item %d: %+v %+v, want %s", i, r[i].Ok, r[i].Error, code)
		}
	}
	ok(0, "2", false)
	fail(1, "invalid_argument")
	ok(2, "3", false)
	ok(3, "2", true)
	if r[3].Ok.MsgID != r[0].Ok.MsgID {
		t.Fatalf("the resend in the batch got msg_id %s, the first %s", r[3].Ok.MsgID, r[0].Ok.MsgID)
	}
	ok(4, "1", false)
	fail(5, "already_exists")
	ok(6, "4", false)
	fail(7, "already_exists")
	if !strings.Contains(r[7].Error.Message, "different content") || strings.Contains(r[5].Error.Message, "g:1") {
		t.Fatalf("already_exists messages: %q / %q", r[7].Error.Message, r[5].Error.Message)
	}
	ok(8, "5", false)

	// The whole batch again: every stored item is a duplicate with its ids.
	_, again := sendBatchJSON(t, addr, `{"items":[`+strings.Join(items, ",")+`]}`)
	for _, i := range []int{0, 2, 3, 4, 6, 8} {
		if again.Results[i].Ok == nil || !again.Results[i].Ok.Duplicate || again.Results[i].Ok.Seq != r[i].Ok.Seq {
			t.Fatalf("resent item %d: %+v, first %+v", i, again.Results[i], r[i])
		}
	}
	if status, raw := postJSON(t, addr, "GetHead", `{"convId":"g:1"}`); status != 200 || !strings.Contains(raw, `"5"`) {
		t.Fatalf("g:1 head after both batches: %d %s, want 5", status, raw)
	}
}

// Batched load through the SDK (concurrent Sends coalesce into SendBatch)
// and through raw SendBatch requests, kill -9 in the middle, restart: every
// acked message is stored at its seq, seqs are 1..head, the next send gets
// head+1 (both stores).
func TestSendBatchKill9(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		n := startNode(t, "node", "--store", spec)
		convs := convNames(60)
		sdk, err := client.New(client.Config{Addrs: []string{n.Addr}, Retry: client.RetryPolicy{Deadline: 5 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer sdk.Close()
		raw := n.grpcClient()
		l := &load{convs: convs, clients: 64, led: newLedger(),
			sendFn: func(ctx context.Context, i int, conv string, from uint64, cid string, body []byte) (uint64, uint64, error) {
				if i%2 == 0 {
					res, err := sdk.Send(ctx, client.SendRequest{ConvID: conv, FromUID: from, ClientMsgID: cid, Body: body})
					return res.MsgID, res.Seq, err
				}
				// A raw batch of this message and a resend of it.
				it := &sequencerv1.SendRequest{ConvId: conv, FromUid: from, ClientMsgId: cid, Body: body}
				resp, err := raw.SendBatch(ctx, connect.NewRequest(&sequencerv1.SendBatchRequest{Items: []*sequencerv1.SendRequest{it, it}}))
				if err != nil {
					return 0, 0, err
				}
				res := resp.Msg.GetResults()
				a, b := res[0].GetOk(), res[1].GetOk()
				if a == nil || b == nil {
					e := res[0].GetError()
					if e == nil {
						e = res[1].GetError()
					}
					var code connect.Code
					_ = code.UnmarshalText([]byte(e.GetCode()))
					return 0, 0, connect.NewError(code, fmt.Errorf("%s", e.GetMessage()))
				}
				if a.MsgId != b.MsgId || a.Seq != b.Seq || !b.Duplicate {
					t.Errorf("a key twice in one batch: %+v then %+v", a, b)
				}
				return a.MsgId, a.Seq, nil
			},
			retryable: func(err error) bool { return retryableCode(err) || connect.CodeOf(err) == connect.CodeUnavailable },
		}
		ctx, cancel := context.WithCancel(context.Background())
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { l.run(ctx, t, stop); close(done) }()
		waitFor(t, 60*time.Second, "400 acks before the kill", func() bool { return l.led.count() >= 400 })
		n.kill()
		close(stop)
		cancel()
		<-done
		n.start(n.Addr)
		c := n.grpcClient()
		for _, conv := range convs[:5] {
			hr, err := c.GetHead(context.Background(), connect.NewRequest(&sequencerv1.GetHeadRequest{ConvId: conv}))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := send(context.Background(), c, conv, 7, "after-"+conv, nil)
			if err != nil || resp.Seq != hr.Msg.GetHeadSeq()+1 {
				t.Fatalf("%s after restart: %v %v, want seq %d", conv, resp, err, hr.Msg.GetHeadSeq()+1)
			}
		}
		if err := n.term(30 * time.Second); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		l.led.verify(t, openStore(t, spec), convs)
		t.Logf("acked before kill -9: %d", l.led.count())
	})
}
