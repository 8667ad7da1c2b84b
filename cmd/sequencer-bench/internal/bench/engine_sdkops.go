package bench

import (
	"context"
	"fmt"

	"github.com/sequencer-im/sequencer/client"
)

// The opt-in operation engines (read positions of issue 21, edits and
// recalls of issue 32) share one skeleton: each "message" of their results
// is one unary RPC of the Go SDK (one attempt, like engine e) to a
// 'sequencer serve' the bench starts per scenario, on PostgreSQL (key) or
// on the embedded store (key-sqlite, a fresh SQLite file per scenario).
// Before the load they seed the scenario's conversations (Seeder, not
// measured). They are not in the default engine list.

// Seeder is implemented by engines that prepare the store for a scenario
// before the load (not measured): convs conversations named
// convID(convPfx, k), worked by senders uids 1..senders.
type Seeder interface {
	Seed(ctx context.Context, convPfx string, convs, senders int) error
}

// Seed passes a seeding request to the client when it seeds.
func (e *remoteEngine) Seed(ctx context.Context, convPfx string, convs, senders int) error {
	if s, ok := e.Engine.(Seeder); ok {
		return s.Seed(ctx, convPfx, convs, senders)
	}
	return nil
}

// registerOpEngines registers the opt-in engines key (PostgreSQL) and
// key-sqlite (the embedded store): name and what say what one operation
// is; open makes the engine around its SDK client (one attempt; it batches
// only SendMany, the seeding; env to open another).
func registerOpEngines(key, name, what string, open func(c *client.Client, env Env) (Engine, error)) {
	for _, sqlite := range []bool{false, true} {
		k, n, store := key, name, "PostgreSQL"
		if sqlite {
			k, n, store = key+"-sqlite", name+", SQLite", "the embedded store (a fresh SQLite file per scenario)"
		}
		s := remoteSpec(k, n, sqlite, what+" through the Go SDK to a 'sequencer serve' on "+store, func(env Env) (Engine, error) {
			c, err := client.New(sdkConfig(env, true)) // batching serves SendMany (the seeding); the operations are unary
			if err != nil {
				return nil, err
			}
			e, err := open(c, env)
			if err != nil {
				c.Close()
				return nil, err
			}
			return e, nil
		})
		s.OptIn = true
		registerEngine(s)
	}
}

// seedChunk is how many messages one seeding SendMany carries.
const seedChunk = 1000

// seedMessages stores perConv messages from uid 1 in each of convs
// conversations (SendMany, seedChunk at a time; every conversation's i-th
// before any (i+1)-th) and hands got each one's conversation index k,
// message index i and msg_id.
func seedMessages(ctx context.Context, c *client.Client, convPfx string, convs, perConv int, got func(k, i int, msgID uint64)) error {
	var reqs []client.SendRequest
	var at [][2]int // (k, i) of each request
	flush := func() error {
		res, errs := c.SendMany(ctx, reqs)
		for j, err := range errs {
			if err != nil {
				return fmt.Errorf("seed messages: %w", err)
			}
			got(at[j][0], at[j][1], res[j].MsgID)
		}
		reqs, at = reqs[:0], at[:0]
		return nil
	}
	for i := range perConv {
		for k := range convs {
			reqs = append(reqs, client.SendRequest{ConvID: convID(convPfx, k), FromUID: 1, ClientMsgID: fmt.Sprintf("%sseed-%d-%d", convPfx, k, i), Body: []byte("seed")})
			at = append(at, [2]int{k, i})
			if len(reqs) == seedChunk {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if len(reqs) > 0 {
		return flush()
	}
	return nil
}
