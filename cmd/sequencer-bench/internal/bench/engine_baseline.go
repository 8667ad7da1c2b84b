package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/idgen"
)

// The seed article's approaches, built the way the seed builds them, on the
// same im_message table: (b) Redis INCR then one INSERT per message, (c) a
// database segment of 1,000 seqs then one INSERT per message, and (d) the
// storage ceiling: COPY of large batches with no sequencing at all.

func init() {
	registerEngine(EngineSpec{
		Key: "b", Name: "Redis INCR + INSERT",
		About:       "INCR seq:conv:{id} in Redis (floor saved every 1,000), then one autocommit INSERT per message (the seed's first choice)",
		NeedsSchema: true, NeedsBaselineTables: true,
		Open: openRedisINCR,
	})
	registerEngine(EngineSpec{
		Key: "c", Name: "DB segment + INSERT",
		About:       "1,000 seqs per round trip from a segment table, then one autocommit INSERT per message (the seed's fallback)",
		NeedsSchema: true, NeedsBaselineTables: true,
		Open: openSegment,
	})
	registerEngine(EngineSpec{
		Key: "d", Name: "COPY, no seq (ceiling)",
		About:       "messages queued by the senders are COPYed in batches of up to --copy-batch rows from --copy-writers connections; seq = msg_id, no sequencing",
		NeedsSchema: true, NeedsBaselineTables: true,
		Open: openCopy,
	})
}

// rowStore is where a baseline engine writes: one autocommit INSERT per
// message, the floor and the segment table (PostgreSQL: rowWriter; MySQL:
// myRowWriter in engine_mysql.go).
type rowStore interface {
	insertOne(ctx context.Context, req *sequencer.SendRequest, msgID, seq uint64) (sequencer.SendResult, error)
	saveFloor(ctx context.Context, convID string, seq int64) error
	takeSegment(ctx context.Context, convID string, n int) (last int64, err error)
	Batches(context.Context) (BatchStats, error)
	Close() error
}

// storedAt is a server_at value: now at the column's millisecond precision.
func storedAt() time.Time { return time.Now().Truncate(time.Millisecond) }

// rowWriter stores messages one autocommit INSERT each: every stored
// message is its own commit.
type rowWriter struct {
	pool     *pgxpool.Pool
	inserts  atomic.Uint64
	insertNs atomic.Int64
}

// Batches reports one message per commit.
func (w *rowWriter) Batches(context.Context) (BatchStats, error) {
	n := w.inserts.Load()
	return BatchStats{Commits: n, Messages: n, CommitSeconds: time.Duration(w.insertNs.Load()).Seconds()}, nil
}

func (w *rowWriter) Close() error { w.pool.Close(); return nil }

// insertOne stores one message in its own autocommit statement, and answers a
// resend of the same (from_uid, client_msg_id) with the first send's ids, as
// the seed's uk_from_client "idempotency gate" does (the seq taken for the
// resend is then a hole, which the seed accepts).
func (w *rowWriter) insertOne(ctx context.Context, req *sequencer.SendRequest, msgID, seq uint64) (sequencer.SendResult, error) {
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return sequencer.SendResult{}, fmt.Errorf("insert message conv=%s seq=%d: %w", req.ConvID, seq, err)
	}
	at := storedAt()
	t0 := time.Now() // the commit's own time, not the wait for a connection
	_, err = conn.Exec(ctx, insertMessageSQL, int64(msgID), req.ConvID, int64(seq), int64(req.FromUID),
		req.MsgType, req.Body, req.ClientMsgID, at)
	conn.Release()
	if err == nil {
		w.insertNs.Add(int64(time.Since(t0)))
		w.inserts.Add(1)
		return sequencer.SendResult{MsgID: msgID, Seq: seq, ServerAt: at}, nil
	}
	if isUniqueViolation(err, "uk_from_client") {
		return firstSend(ctx, w.pool, req)
	}
	return sequencer.SendResult{}, fmt.Errorf("insert message conv=%s seq=%d: %w", req.ConvID, seq, err)
}

// firstSend returns the ids of the stored message with req's resend key.
func firstSend(ctx context.Context, pool *pgxpool.Pool, req *sequencer.SendRequest) (sequencer.SendResult, error) {
	var (
		id, seq int64
		conv    string
		at      time.Time
	)
	err := pool.QueryRow(ctx, findByClientKeySQL, int64(req.FromUID), req.ClientMsgID).Scan(&id, &conv, &seq, &at)
	if err != nil {
		return sequencer.SendResult{}, fmt.Errorf("read first send of %d/%s: %w", req.FromUID, req.ClientMsgID, err)
	}
	if conv != req.ConvID {
		return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeAlreadyExists, sequencer.ErrAlreadyExists,
			fmt.Sprintf("client_msg_id %q of %d used in %s", req.ClientMsgID, req.FromUID, conv))
	}
	return sequencer.SendResult{MsgID: uint64(id), Seq: uint64(seq), ServerAt: at, Duplicate: true}, nil
}

// ---- (b) Redis INCR ----

// saveFloorSQL records the seq floor; it never lowers it.
const saveFloorSQL = `INSERT INTO seq_floor (conv_id, floor) VALUES ($1, $2)
ON CONFLICT (conv_id) DO UPDATE SET floor = GREATEST(seq_floor.floor, EXCLUDED.floor)`

// floorEvery is how often (in seqs) the seed persists the Redis floor.
const floorEvery = 1000

type redisINCR struct {
	rowStore
	rdb    *redis.Client
	prefix string
	ids    *idgen.Generator
	logf   func(string, ...any)
}

func openRedisINCR(ctx context.Context, env Env) (Engine, error) {
	if env.Redis == nil {
		return nil, errors.New("engine b needs Redis (--redis)")
	}
	pool, err := openPool(ctx, env.DSN, env.Pool)
	if err != nil {
		return nil, err
	}
	ids, err := idgen.New(idgen.Config{WorkerID: 2})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return newRedisINCR(&rowWriter{pool: pool}, env, ids), nil
}

func newRedisINCR(rows rowStore, env Env, ids *idgen.Generator) *redisINCR {
	return &redisINCR{rowStore: rows, rdb: env.Redis, prefix: env.RedisPrefix, ids: ids, logf: env.Logf}
}

func (w *rowWriter) saveFloor(ctx context.Context, convID string, seq int64) error {
	_, err := w.pool.Exec(ctx, saveFloorSQL, convID, seq)
	return err
}

func (w *rowWriter) takeSegment(ctx context.Context, convID string, n int) (int64, error) {
	var last int64
	err := w.pool.QueryRow(ctx, takeSegmentSQL, convID, n).Scan(&last)
	return last, err
}

// nextSeq is the seed's SeqAllocator.NextSeq: INCR a key that has no TTL,
// and every 1,000 seqs save the floor (a failed save is only logged).
func (e *redisINCR) nextSeq(ctx context.Context, convID string) (uint64, error) {
	key := e.prefix + "seq:conv:" + convID
	seq, err := e.rdb.Incr(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("incr %s: %w", key, err)
	}
	if seq%floorEvery == 0 {
		if err := e.saveFloor(ctx, convID, seq); err != nil && e.logf != nil {
			e.logf("save seq floor failed conv=%s seq=%d: %v", convID, seq, err)
		}
	}
	return uint64(seq), nil
}

func (e *redisINCR) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	seq, err := e.nextSeq(ctx, req.ConvID)
	if err != nil {
		return sequencer.SendResult{}, err
	}
	id, err := e.ids.Next()
	if err != nil {
		return sequencer.SendResult{}, err
	}
	return e.insertOne(ctx, &req, id, seq)
}

// ---- (c) database segment ----

// segmentSize is how many seqs one round trip to the segment table takes.
const segmentSize = 1000

// takeSegmentSQL hands out the next segment of a conversation in one
// autocommit round trip and returns its last seq.
const takeSegmentSQL = `INSERT INTO seq_segment (conv_id, max_seq) VALUES ($1, $2)
ON CONFLICT (conv_id) DO UPDATE SET max_seq = seq_segment.max_seq + EXCLUDED.max_seq
RETURNING max_seq`

type segmentEngine struct {
	rowStore
	ids  *idgen.Generator
	segs sync.Map // conv_id -> *segment
}

// segment is the unused rest of a conversation's current segment: next..max.
type segment struct {
	mu        sync.Mutex
	next, max uint64
}

func openSegment(ctx context.Context, env Env) (Engine, error) {
	pool, err := openPool(ctx, env.DSN, env.Pool)
	if err != nil {
		return nil, err
	}
	ids, err := idgen.New(idgen.Config{WorkerID: 3})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &segmentEngine{rowStore: &rowWriter{pool: pool}, ids: ids}, nil
}

func (e *segmentEngine) nextSeq(ctx context.Context, convID string) (uint64, error) {
	v, ok := e.segs.Load(convID)
	if !ok {
		v, _ = e.segs.LoadOrStore(convID, &segment{})
	}
	s := v.(*segment)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next == 0 || s.next > s.max {
		last, err := e.takeSegment(ctx, convID, segmentSize)
		if err != nil {
			return 0, fmt.Errorf("take segment conv=%s: %w", convID, err)
		}
		s.next, s.max = uint64(last)-segmentSize+1, uint64(last)
	}
	seq := s.next
	s.next++
	return seq, nil
}

func (e *segmentEngine) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	seq, err := e.nextSeq(ctx, req.ConvID)
	if err != nil {
		return sequencer.SendResult{}, err
	}
	id, err := e.ids.Next()
	if err != nil {
		return sequencer.SendResult{}, err
	}
	return e.insertOne(ctx, &req, id, seq)
}

// ---- (d) COPY ceiling ----

type copyEngine struct {
	pool    *pgxpool.Pool
	ids     *idgen.Generator
	in      chan *copyReq
	max     int
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
	commits atomic.Uint64
	rows    atomic.Uint64
	copyNs  atomic.Int64
}

type copyReq struct {
	msg  sequencer.Message
	done chan error
}

var copyReqPool = sync.Pool{New: func() any { return &copyReq{done: make(chan error, 1)} }}

func openCopy(ctx context.Context, env Env) (Engine, error) {
	writers := max(env.CopyWriters, 1)
	pool, err := openPool(ctx, env.DSN, writers)
	if err != nil {
		return nil, err
	}
	ids, err := idgen.New(idgen.Config{WorkerID: 4})
	if err != nil {
		pool.Close()
		return nil, err
	}
	e := &copyEngine{pool: pool, ids: ids, in: make(chan *copyReq, 1<<16), max: max(env.CopyBatch, 1)}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	for range writers {
		e.wg.Add(1)
		go e.writer()
	}
	return e, nil
}

func (e *copyEngine) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	id, err := e.ids.Next()
	if err != nil {
		return sequencer.SendResult{}, err
	}
	r := copyReqPool.Get().(*copyReq)
	r.msg = sequencer.Message{MsgID: id, ConvID: req.ConvID, Seq: id, FromUID: req.FromUID, MsgType: req.MsgType,
		Body: req.Body, ClientMsgID: req.ClientMsgID, ServerAt: storedAt()}
	select {
	case e.in <- r:
	case <-ctx.Done():
		return sequencer.SendResult{}, ctx.Err()
	}
	// Once queued, the writer owns r until it answers; wait for the answer
	// even if ctx ends, so r can be reused safely.
	err = <-r.done
	res := sequencer.SendResult{MsgID: id, Seq: id, ServerAt: r.msg.ServerAt}
	r.msg = sequencer.Message{}
	copyReqPool.Put(r)
	if err != nil {
		return sequencer.SendResult{}, err
	}
	return res, nil
}

// writer takes whatever is queued (up to max rows) and COPYs it in one
// autocommit statement, then answers every sender in the batch.
func (e *copyEngine) writer() {
	defer e.wg.Done()
	batch := make([]*copyReq, 0, e.max)
	for {
		r, ok := <-e.in
		if !ok {
			return
		}
		batch = append(batch[:0], r)
	drain:
		for len(batch) < e.max {
			select {
			case r, ok := <-e.in:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		t0 := time.Now()
		_, err := e.pool.CopyFrom(e.ctx, pgx.Identifier{"im_message"}, messageColumns, &copyRows{batch: batch, i: -1})
		if err != nil {
			err = fmt.Errorf("copy %d rows: %w", len(batch), err)
		} else {
			e.copyNs.Add(int64(time.Since(t0)))
			e.commits.Add(1)
			e.rows.Add(uint64(len(batch)))
		}
		for _, r := range batch {
			r.done <- err
		}
	}
}

func (e *copyEngine) Batches(context.Context) (BatchStats, error) {
	return BatchStats{Commits: e.commits.Load(), Messages: e.rows.Load(), CommitSeconds: time.Duration(e.copyNs.Load()).Seconds()}, nil
}

func (e *copyEngine) Close() error {
	close(e.in)
	e.wg.Wait()
	e.cancel()
	e.pool.Close()
	return nil
}

// copyRows feeds a batch to pgx's COPY, reusing one row slice.
type copyRows struct {
	batch []*copyReq
	i     int
	row   [8]any
}

func (c *copyRows) Next() bool { c.i++; return c.i < len(c.batch) }
func (c *copyRows) Err() error { return nil }
func (c *copyRows) Values() ([]any, error) {
	m := &c.batch[c.i].msg
	c.row = [8]any{int64(m.MsgID), m.ConvID, int64(m.Seq), int64(m.FromUID), m.MsgType, m.Body, m.ClientMsgID, m.ServerAt}
	return c.row[:], nil
}
