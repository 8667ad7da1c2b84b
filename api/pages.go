package api

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Cursor bounds of PullMany and Subscribe (docs/API.md).
const (
	MaxPullManyCursors  = 1000
	MaxSubscribeCursors = 10_000
)

const methodPullMany = "PullMany"

// ValidateCursors checks the cursors of a PullMany or Subscribe: 1..max of
// them, each conv_id valid as in Send, no conversation twice. after_seq
// takes any value. Every error has code invalid_argument.
func ValidateCursors(cs []*sequencerv1.Cursor, max int) ([]persist.Cursor, error) {
	if n := len(cs); n < 1 || n > max {
		return nil, sequencer.Errorf(sequencer.CodeInvalidArgument, "cursors: must hold 1..%d cursors, got %d", max, n)
	}
	out := make([]persist.Cursor, len(cs))
	seen := make(map[string]int, len(cs))
	for i, c := range cs {
		id := c.GetConvId()
		if err := ValidateConvID(id); err != nil {
			return nil, fmt.Errorf("cursors[%d]: %w", i, err)
		}
		if j, dup := seen[id]; dup {
			return nil, sequencer.Errorf(sequencer.CodeInvalidArgument, "cursors[%d]: conversation %q is already cursors[%d]", i, id, j)
		}
		seen[id] = i
		out[i] = persist.Cursor{ConvID: id, AfterSeq: c.GetAfterSeq()}
	}
	return out, nil
}

// pullBefore answers a Pull with before_seq: the newest q.Limit messages
// with after_seq < seq < min(before_seq, head+1), ascending, and as many of
// the newest as fit max_bytes (at least one). has_more: the page was cut
// (by limit or bytes) and its first seq is above after_seq+1, so older
// messages of the range were left out (retention may have deleted them
// since: the next page is then empty with has_more false).
func (s *Service) pullBefore(ctx context.Context, q PullQuery, head uint64) (*sequencerv1.PullResponse, error) {
	resp := &sequencerv1.PullResponse{HeadSeq: head}
	before := min(q.BeforeSeq, head+1)
	if q.AfterSeq >= head || before <= q.AfterSeq+1 {
		return resp, nil
	}
	rows, err := s.reader.ReadBefore(ctx, q.ConvID, q.AfterSeq, before, q.Limit)
	if err != nil {
		return nil, err
	}
	cut, size := 0, 0
	for i := len(rows) - 1; i >= 0; i-- {
		n := messageSize(&rows[i])
		if i < len(rows)-1 && size+n > q.MaxBytes {
			cut = i + 1
			break
		}
		size += n
	}
	full := len(rows) == q.Limit || cut > 0
	rows = rows[cut:]
	resp.Messages = make([]*sequencerv1.Message, len(rows))
	for i := range rows {
		resp.Messages[i] = messageProto(&rows[i])
	}
	resp.HasMore = full && len(rows) > 0 && rows[0].Seq > q.AfterSeq+1
	return resp, nil
}

// PullMany answers up to MaxPullManyCursors cursors from one store read
// (persist.PageReader.ReadMany): pages[i] answers cursors[i] as a Pull of
// it would, with limit per conversation and max_bytes over the whole
// answer (at least one message overall), filled in request order.
func (s *Service) PullMany(ctx context.Context, req *connect.Request[sequencerv1.PullManyRequest]) (*connect.Response[sequencerv1.PullManyResponse], error) {
	cursors, err := ValidateCursors(req.Msg.GetCursors(), MaxPullManyCursors)
	if err != nil {
		return nil, s.fail(ctx, methodPullMany, err)
	}
	q, _ := ValidatePull(&sequencerv1.PullRequest{ConvId: "-", Limit: req.Msg.GetLimit(), MaxBytes: req.Msg.GetMaxBytes()})
	// Every message counts at least 64 bytes (messageSize): the store need
	// not read more than this many for max_bytes to cut the answer (the
	// first message always goes; one more shows the cut).
	total := q.MaxBytes/64 + 2
	pages, err := s.reader.ReadMany(ctx, cursors, q.Limit, total)
	if err == nil && len(pages) != len(cursors) {
		err = fmt.Errorf("the store answered %d pages for %d cursors", len(pages), len(cursors))
	}
	if err != nil {
		return nil, s.fail(ctx, methodPullMany, fmt.Errorf("read many: %w", err), "conversations", len(cursors))
	}
	// The answer's messages are made in three allocations, not three per
	// message (a call answers up to 1,000 x limit of them).
	n := 0
	for _, p := range pages {
		n += len(p.Messages)
	}
	protos := newMessageProtos(n)
	answers := make([]sequencerv1.PullResponse, len(pages))
	out := make([]*sequencerv1.PullResponse, len(pages))
	size, sent, spent := 0, 0, false
	for i, p := range pages {
		page := &answers[i]
		page.HeadSeq = p.Head
		cut := spent
		if !spent {
			k := 0
			for ; k < len(p.Messages); k++ {
				n := messageSize(&p.Messages[k])
				if sent > 0 && size+n > q.MaxBytes {
					cut, spent = true, true
					break
				}
				size += n
				sent++
			}
			page.Messages = protos.next(p.Messages[:k])
		}
		after := cursors[i].AfterSeq
		if n := len(page.Messages); n > 0 {
			last := page.Messages[n-1].Seq
			page.HeadSeq = max(page.HeadSeq, last)
			page.HasMore = (cut || n == q.Limit) && last < page.HeadSeq
		} else {
			page.HasMore = cut && after < page.HeadSeq
		}
		out[i] = page
	}
	s.ok(methodPullMany)
	return connect.NewResponse(&sequencerv1.PullManyResponse{Pages: out}), nil
}

// messageProtos hands out the wire forms of many messages from shared
// arrays (messageProto's fields, without its allocations per message).
type messageProtos struct {
	ptrs   []*sequencerv1.Message
	msgs   []sequencerv1.Message
	stamps []timestamppb.Timestamp
}

func newMessageProtos(n int) *messageProtos {
	return &messageProtos{ptrs: make([]*sequencerv1.Message, n), msgs: make([]sequencerv1.Message, n), stamps: make([]timestamppb.Timestamp, n)}
}

// next returns ms's wire forms (nil for none), from the next len(ms)
// entries of the arrays.
func (p *messageProtos) next(ms []sequencer.Message) []*sequencerv1.Message {
	if len(ms) == 0 {
		return nil
	}
	out := p.ptrs[:len(ms):len(ms)]
	for i := range ms {
		pm, m := &p.msgs[i], &ms[i]
		fillMessageProto(pm, m)
		if !m.ServerAt.IsZero() {
			ts := &p.stamps[i]
			ts.Seconds, ts.Nanos = m.ServerAt.Unix(), int32(m.ServerAt.Nanosecond())
			pm.ServerAt = ts
		}
		out[i] = pm
	}
	p.ptrs, p.msgs, p.stamps = p.ptrs[len(ms):], p.msgs[len(ms):], p.stamps[len(ms):]
	return out
}
