package actor

import (
	"context"
	"sort"
	"sync"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// memStore is an in-memory persist.Store with the commit rules of the real
// ones (head compare-and-set, unique msg_id / uk_conv_seq / uk_from_client,
// all-or-nothing), for tests of the actor layer without a database.
type memStore struct {
	persist.Store // worker leases etc.: not used by the actor layer

	mu    sync.Mutex
	heads map[string]uint64
	rows  map[string]map[uint64]sequencer.Message
	keys  map[sequencer.ClientKey]sequencer.Message
	ids   map[uint64]sequencer.Message
	txs   int
}

func newMemStore() *memStore {
	return &memStore{heads: map[string]uint64{}, rows: map[string]map[uint64]sequencer.Message{},
		keys: map[sequencer.ClientKey]sequencer.Message{}, ids: map[uint64]sequencer.Message{}}
}

func (s *memStore) Commit(ctx context.Context, bs []persist.ConvBatch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var mismatch []string
	ce := &persist.ConflictError{}
	seenKey := map[sequencer.ClientKey]bool{}
	for _, b := range bs {
		if s.heads[b.ConvID] != b.PrevHead {
			mismatch = append(mismatch, b.ConvID)
		}
		for _, m := range b.Messages {
			c := persist.Conflict{ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, FromUID: m.FromUID, ClientMsgID: m.ClientMsgID}
			if _, ok := s.keys[m.Key()]; ok || seenKey[m.Key()] {
				c.Key = persist.KeyClientMsgID
				ce.Conflicts = append(ce.Conflicts, c)
			}
			if _, ok := s.ids[m.MsgID]; ok {
				c.Key = persist.KeyMsgID
				ce.Conflicts = append(ce.Conflicts, c)
			}
			seenKey[m.Key()] = true
		}
	}
	if len(mismatch) > 0 {
		return &persist.HeadMismatchError{ConvIDs: mismatch}
	}
	if len(ce.Conflicts) > 0 {
		return ce
	}
	for _, b := range bs {
		if s.rows[b.ConvID] == nil {
			s.rows[b.ConvID] = map[uint64]sequencer.Message{}
		}
		for _, m := range b.Messages {
			s.rows[b.ConvID][m.Seq] = m
			s.keys[m.Key()] = m
			s.ids[m.MsgID] = m
		}
		s.heads[b.ConvID] = b.LastSeq()
	}
	s.txs++
	return nil
}

func (s *memStore) LoadHead(ctx context.Context, conv string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heads[conv], nil
}

func (s *memStore) FindByClientKey(ctx context.Context, k sequencer.ClientKey) (sequencer.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.keys[k]
	if !ok {
		return m, sequencer.ErrNotFound
	}
	return m, nil
}

func (s *memStore) ReadRange(ctx context.Context, conv string, after uint64, limit int) ([]sequencer.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sequencer.Message
	for seq := after + 1; len(out) < limit; seq++ {
		m, ok := s.rows[conv][seq]
		if !ok {
			break
		}
		out = append(out, m)
	}
	return out, nil
}

func (s *memStore) GetMessage(ctx context.Context, id uint64) (sequencer.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.ids[id]
	if !ok {
		return m, sequencer.ErrNotFound
	}
	return m, nil
}

func (s *memStore) convs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for c := range s.heads {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

func (s *memStore) Settle(context.Context) error { return nil }
