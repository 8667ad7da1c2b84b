package client

import (
	"context"
	"fmt"
	"math"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// PullLatest returns the newest limit messages of convID with seq below
// beforeSeq (0 or anything above the head: from the head), ascending;
// HasMore says older ones remain: call again with the first returned seq.
// limit 0 means the server's default 100. Any node answers it.
func (c *Client) PullLatest(ctx context.Context, convID string, beforeSeq uint64, limit int) (PullResult, error) {
	if beforeSeq == 0 {
		beforeSeq = math.MaxUint64
	}
	if limit < 0 {
		return PullResult{}, sequencer.Errorf(sequencer.CodeInvalidArgument, "pull latest conv_id %q: limit %d: must be >= 0", convID, limit)
	}
	req := &sequencerv1.PullRequest{ConvId: convID, BeforeSeq: beforeSeq, Limit: uint32(min(limit, math.MaxUint32))}
	var out PullResult
	err := c.retry(ctx, call{op: "pull latest", convID: convID, subject: fmt.Sprintf("conv_id %q before_seq %d", convID, beforeSeq)},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.Pull(ctx, connect.NewRequest(req))
			if err != nil {
				return target, err
			}
			out = pullResult(resp.Msg)
			return target, nil
		})
	return out, err
}

// PullMany returns, for each cursor (1..1,000, no conversation twice), what
// a Pull after its AfterSeq would (pages[i] answers cursors[i]), from one
// store read on the server: limit per conversation (0: 100), maxBytes for
// the whole answer (0: 1 MiB; at least one message overall). Any node
// answers it.
func (c *Client) PullMany(ctx context.Context, cursors []Cursor, limit, maxBytes int) ([]PullResult, error) {
	if limit < 0 || maxBytes < 0 {
		return nil, sequencer.Errorf(sequencer.CodeInvalidArgument, "pull many: limit %d, max_bytes %d: must be >= 0", limit, maxBytes)
	}
	req := &sequencerv1.PullManyRequest{Limit: uint32(min(limit, math.MaxUint32)), MaxBytes: uint32(min(maxBytes, math.MaxUint32)),
		Cursors: make([]*sequencerv1.Cursor, len(cursors))}
	for i, cur := range cursors {
		req.Cursors[i] = &sequencerv1.Cursor{ConvId: cur.ConvID, AfterSeq: cur.AfterSeq}
	}
	var out []PullResult
	err := c.retry(ctx, call{op: "pull many", subject: fmt.Sprintf("%d conversations", len(cursors))},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.PullMany(ctx, connect.NewRequest(req))
			if err != nil {
				return target, err
			}
			pages := resp.Msg.GetPages()
			if len(pages) != len(cursors) {
				return target, sequencer.Errorf(sequencer.CodeInternal, "pull many: the server answered %d pages for %d cursors", len(pages), len(cursors))
			}
			// Every page's messages in one allocation (up to 1,000 x
			// limit of them); a page's slice has no room to append into
			// the next.
			n := 0
			for _, p := range pages {
				n += len(p.GetMessages())
			}
			all := make([]Message, n)
			out = make([]PullResult, len(pages))
			for i, p := range pages {
				k := len(p.GetMessages())
				out[i] = pullResultInto(p, all[:k:k])
				all = all[k:]
			}
			return target, nil
		})
	return out, err
}

func pullResult(p *sequencerv1.PullResponse) PullResult {
	return pullResultInto(p, make([]Message, len(p.GetMessages())))
}

// pullResultInto is pullResult with its messages in ms (len(p.Messages)
// of them).
func pullResultInto(p *sequencerv1.PullResponse, ms []Message) PullResult {
	for i, m := range p.GetMessages() {
		ms[i] = messageFromProto(m)
	}
	return PullResult{HeadSeq: p.GetHeadSeq(), HasMore: p.GetHasMore(), Messages: ms}
}
