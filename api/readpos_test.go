package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// fakePositions is the harness's ReadPositions: the reader's memstore, with
// its calls counted and every call failing while err is set.
type fakePositions struct {
	store *memstore.Store
	mu    sync.Mutex
	err   error
	calls int
}

func (f *fakePositions) enter() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.err
}

func (f *fakePositions) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakePositions) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakePositions) MarkRead(ctx context.Context, convID string, uid, seq uint64) (sequencer.ReadState, error) {
	if err := f.enter(); err != nil {
		return sequencer.ReadState{}, err
	}
	return f.store.MarkRead(ctx, convID, uid, seq)
}

func (f *fakePositions) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]sequencer.ReadState, error) {
	if err := f.enter(); err != nil {
		return nil, err
	}
	return f.store.ReadStates(ctx, uid, convIDs)
}

const (
	markReadPath  = sequencerv1connect.SequencerServiceMarkReadProcedure
	readStatePath = sequencerv1connect.SequencerServiceGetReadStateProcedure
)

// MarkRead and GetReadState as curl posts them: 64-bit numbers are strings,
// zeros are omitted (protojson), states answer conv_ids in order.
func TestReadPositionsJSON(t *testing.T) {
	h := newHarness(t)
	h.reader.put(5, msgs("g:1", 1, 2, 3, 4, 5)...)
	for _, tc := range []struct{ body, want string }{
		{`{"convId":"g:1","uid":"7","seq":"3"}`, `{"readSeq":"3","headSeq":"5","unread":"2"}`},
		{`{"convId":"g:1","uid":"7","seq":"2"}`, `{"readSeq":"3","headSeq":"5","unread":"2"}`}, // never backwards
		{`{"convId":"g:1","uid":"7"}`, `{"readSeq":"3","headSeq":"5","unread":"2"}`},           // seq 0: the state
		{`{"convId":"g:1","uid":"7","seq":"99"}`, `{"readSeq":"5","headSeq":"5"}`},             // clamped to the head
		{`{"convId":"g:empty","uid":"7","seq":"4"}`, `{}`},                                     // head 0: nothing to read
	} {
		status, _, raw := h.post(t, markReadPath, tc.body)
		if status != 200 || !sameJSON(t, raw, tc.want) {
			t.Fatalf("MarkRead %s: %d %s, want %s", tc.body, status, raw, tc.want)
		}
	}
	status, _, raw := h.post(t, readStatePath, `{"uid":"7","convIds":["g:1","g:none","g:1"]}`)
	want := `{"states":[{"convId":"g:1","readSeq":"5","headSeq":"5"},{"convId":"g:none"},{"convId":"g:1","readSeq":"5","headSeq":"5"}]}`
	if status != 200 || !sameJSON(t, raw, want) {
		t.Fatalf("GetReadState: %d %s, want %s", status, raw, want)
	}
	status, _, raw = h.post(t, readStatePath, `{"uid":"8","convIds":["g:1"]}`)
	if want := `{"states":[{"convId":"g:1","headSeq":"5","unread":"5"}]}`; status != 200 || !sameJSON(t, raw, want) {
		t.Fatalf("GetReadState of another user: %d %s, want %s", status, raw, want)
	}
	if got := counterValue(t, h.metrics.Requests.WithLabelValues(methodMarkRead, "ok")); got != 5 {
		t.Fatalf("requests{MarkRead,ok} = %v, want 5", got)
	}
	if got := counterValue(t, h.metrics.Requests.WithLabelValues(methodReadState, "ok")); got != 2 {
		t.Fatalf("requests{GetReadState,ok} = %v, want 2", got)
	}
}

func sameJSON(t *testing.T, got, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("answer is not JSON: %q", got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want %q", want)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	return string(gb) == string(wb)
}

// Every bad input is invalid_argument (HTTP 400), names the field, and
// never reaches the store.
func TestReadPositionsValidation(t *testing.T) {
	h := newHarness(t)
	long := strings.Repeat("x", 65)
	many := make([]string, sequencer.MaxReadStateConvs+1)
	for i := range many {
		many[i] = "g:1"
	}
	manyJSON, _ := json.Marshal(many)
	tests := []struct{ name, procedure, body, wantMsg string }{
		{"mark conv_id missing", markReadPath, `{"uid":"1","seq":"1"}`, "conv_id: must be 1..64 bytes, got 0"},
		{"mark conv_id 65", markReadPath, `{"convId":"` + long + `","uid":"1","seq":"1"}`, "conv_id: must be 1..64 bytes, got 65"},
		{"mark conv_id control", markReadPath, `{"convId":"a\u0001","uid":"1","seq":"1"}`, "conv_id: must not contain control characters"},
		{"mark uid missing", markReadPath, `{"convId":"g:1","seq":"1"}`, "uid: must be > 0 and < 2^63, got 0"},
		{"mark uid 2^63", markReadPath, `{"convId":"g:1","uid":"9223372036854775808","seq":"1"}`, "uid: must be > 0 and < 2^63"},
		{"mark seq 2^63", markReadPath, `{"convId":"g:1","uid":"1","seq":"9223372036854775808"}`, "seq: must be < 2^63"},
		{"state uid missing", readStatePath, `{"convIds":["g:1"]}`, "uid: must be > 0 and < 2^63, got 0"},
		{"state uid max", readStatePath, `{"uid":"18446744073709551615","convIds":["g:1"]}`, "uid: must be > 0 and < 2^63"},
		{"state no conv_ids", readStatePath, `{"uid":"1"}`, "conv_ids: must hold 1..1000 conversations, got 0"},
		{"state 1001 conv_ids", readStatePath, `{"uid":"1","convIds":` + string(manyJSON) + `}`, "conv_ids: must hold 1..1000 conversations, got 1001"},
		{"state bad conv_id", readStatePath, `{"uid":"1","convIds":["g:1","` + long + `"]}`, "conv_ids[1]: conv_id: must be 1..64 bytes, got 65"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, m, raw := h.post(t, tt.procedure, tt.body)
			if status != http.StatusBadRequest || m["code"] != "invalid_argument" {
				t.Fatalf("got %d %s, want 400 invalid_argument", status, raw)
			}
			if msg, _ := m["message"].(string); !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("message %q does not contain %q", msg, tt.wantMsg)
			}
		})
	}
	if n := h.reads.count(); n != 0 {
		t.Fatalf("the store was called %d times by invalid requests", n)
	}
	// The boundaries pass: seq 2^63-1 (clamped), 1,000 conversations.
	status, _, raw := h.post(t, markReadPath, `{"convId":"g:1","uid":"9223372036854775807","seq":"9223372036854775807"}`)
	if status != 200 {
		t.Fatalf("largest uid and seq: %d %s", status, raw)
	}
	res, err := h.client().GetReadState(context.Background(), connect.NewRequest(&sequencerv1.GetReadStateRequest{Uid: 1, ConvIds: many[:sequencer.MaxReadStateConvs]}))
	if err != nil || len(res.Msg.GetStates()) != sequencer.MaxReadStateConvs {
		t.Fatalf("1,000 conversations: %v", err)
	}
}

// Store errors keep their code: unavailable is 503 and retryable; a node
// without read positions answers unimplemented.
func TestReadPositionsErrors(t *testing.T) {
	h := newHarness(t)
	h.reads.setErr(sequencer.ErrStoreUnavailable)
	for _, tc := range []struct{ path, body string }{
		{markReadPath, `{"convId":"g:1","uid":"1","seq":"1"}`},
		{readStatePath, `{"uid":"1","convIds":["g:1"]}`},
	} {
		status, m, raw := h.post(t, tc.path, tc.body)
		if status != http.StatusServiceUnavailable || m["code"] != "unavailable" {
			t.Fatalf("%s with the store down: %d %s", tc.path, status, raw)
		}
	}
	none := newHarness(t, func(c *Config) { c.Positions = nil })
	for _, tc := range []struct{ path, body string }{
		{markReadPath, `{"convId":"g:1","uid":"1","seq":"1"}`},
		{readStatePath, `{"uid":"1","convIds":["g:1"]}`},
	} {
		status, m, raw := none.post(t, tc.path, tc.body)
		if status != http.StatusNotImplemented || m["code"] != "unimplemented" {
			t.Fatalf("%s without read positions: %d %s", tc.path, status, raw)
		}
	}
}

func (f *fakePositions) ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error) {
	if err := f.enter(); err != nil {
		return nil, err
	}
	return f.store.ReadCounts(ctx, convID, bounds)
}

func (f *fakePositions) ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]persist.ReadPosition, bool, error) {
	if err := f.enter(); err != nil {
		return nil, false, err
	}
	return f.store.ReadPositionsPage(ctx, convID, afterUID, limit)
}
