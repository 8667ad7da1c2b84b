package persist

import (
	"sort"

	"github.com/sequencer-im/sequencer"
)

// StoredKey is a stored row found holding one unique key of a failed
// commit's rows (a store's follow-up lookup after a unique violation).
type StoredKey struct {
	Key         ConflictKey
	MsgID       uint64
	ConvID      string
	Seq         uint64
	FromUID     uint64
	ClientMsgID string
}

// ConflictsWith maps stored rows holding unique keys to the rows of batches
// that wanted those keys, sorted by conversation, seq and key: the
// *ConflictError a store returns, or nil when none of hits matches a row of
// batches (the conflicting row is gone: the caller reports the commit as not
// written and retryable).
func ConflictsWith(batches []ConvBatch, hits []StoredKey) *ConflictError {
	type convSeq struct {
		conv string
		seq  uint64
	}
	byMsgID := map[uint64]*sequencer.Message{}
	bySeq := map[convSeq]*sequencer.Message{}
	byKey := map[sequencer.ClientKey]*sequencer.Message{}
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			byMsgID[m.MsgID] = m
			bySeq[convSeq{m.ConvID, m.Seq}] = m
			byKey[m.Key()] = m
		}
	}
	var out []Conflict
	for _, h := range hits {
		var m *sequencer.Message
		switch h.Key {
		case KeyMsgID:
			m = byMsgID[h.MsgID]
		case KeyConvSeq:
			m = bySeq[convSeq{h.ConvID, h.Seq}]
		case KeyClientMsgID:
			m = byKey[sequencer.ClientKey{FromUID: h.FromUID, ClientMsgID: h.ClientMsgID}]
		}
		if m == nil {
			continue
		}
		out = append(out, Conflict{Key: h.Key, ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, FromUID: m.FromUID, ClientMsgID: m.ClientMsgID})
	}
	if len(out) == 0 {
		return nil
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].ConvID != out[b].ConvID {
			return out[a].ConvID < out[b].ConvID
		}
		if out[a].Seq != out[b].Seq {
			return out[a].Seq < out[b].Seq
		}
		return out[a].Key < out[b].Key
	})
	return &ConflictError{Conflicts: out}
}
