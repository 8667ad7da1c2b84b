package postgres

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// TestMain stops the throwaway servers (PostgreSQL, Citus) after the run.
func TestMain(m *testing.M) {
	code := m.Run()
	citustest.Stop()
	pgtest.Stop()
	os.Exit(code)
}

// Test-only hooks for the conformance suite.
var _ storetest.Hooks = (*Store)(nil)

func (s *Store) PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO partition_lease (partition, owner, epoch) VALUES ($1, $2, $3)
		ON CONFLICT (partition) DO UPDATE SET owner = EXCLUDED.owner, epoch = EXCLUDED.epoch`,
		int64(f.Partition), f.Owner, int64(f.Epoch))
	return err
}

func (s *Store) SetHeadForTest(ctx context.Context, convID string, head uint64) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO conv_head (conv_id, head) VALUES ($1, $2)
		ON CONFLICT (conv_id) DO UPDATE SET head = EXCLUDED.head`, convID, int64(head))
	return err
}

func openStore(t testing.TB, dsn string) *Store {
	t.Helper()
	return openStoreWith(t, dsn, Options{})
}

func openStoreWith(t testing.TB, dsn string, opts Options) *Store {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, dsn, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStore returns a migrated store on a fresh database.
func newStore(t testing.TB) (*Store, string) {
	t.Helper()
	return newStoreWith(t, Options{})
}

// newStoreWith is newStore with opts.
func newStoreWith(t testing.TB, opts Options) (*Store, string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	s := openStoreWith(t, dsn, opts)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s, dsn
}

// TestConformance runs the suite with the default insert path (the suite's
// commits are small: unnest INSERT) and again with COPY forced.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persist.Store {
		s, _ := newStore(t)
		return s
	})
}

func TestConformanceCopyMode(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persist.Store {
		s, _ := newStore(t)
		s.mode = insertCopy
		return s
	})
}

func TestSchemaMatchesContract(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	rows, err := s.pool.Query(ctx, `SELECT column_name, data_type, COALESCE(character_maximum_length, 0),
		COALESCE(datetime_precision, -1), is_nullable, COALESCE(column_default, '')
		FROM information_schema.columns WHERE table_name = 'im_message' ORDER BY ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	type col struct {
		name, typ     string
		length, prec  int
		nullable, def string
	}
	var got []col
	for rows.Next() {
		var c col
		if err := rows.Scan(&c.name, &c.typ, &c.length, &c.prec, &c.nullable, &c.def); err != nil {
			t.Fatal(err)
		}
		got = append(got, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []col{
		{"msg_id", "bigint", 0, -1, "NO", ""},
		{"conv_id", "character varying", 64, -1, "NO", ""},
		{"seq", "bigint", 0, -1, "NO", ""},
		{"from_uid", "bigint", 0, -1, "NO", ""},
		{"msg_type", "smallint", 0, -1, "NO", "1"},
		{"body", "bytea", 0, -1, "NO", ""},
		{"client_msg_id", "character varying", 64, -1, "NO", ""},
		{"server_at", "timestamp with time zone", 0, 3, "NO", ""},
		// The seed's columns above stay as written; 0007 adds these
		// (docs/API.md, "Storage schema").
		{"kind", "smallint", 0, -1, "NO", "0"},
		{"target_msg_id", "bigint", 0, -1, "NO", "0"},
		{"recalled", "boolean", 0, -1, "NO", "false"},
		{"edit_count", "integer", 0, -1, "NO", "0"},
		{"edited_at", "timestamp with time zone", 0, 3, "YES", ""},
	}
	if len(got) != len(want) {
		t.Fatalf("im_message columns %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("column %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	crows, err := s.pool.Query(ctx, `SELECT conname, contype::text, pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = 'im_message'::regclass ORDER BY conname`)
	if err != nil {
		t.Fatal(err)
	}
	cons := map[string]string{}
	for crows.Next() {
		var name, typ, def string
		if err := crows.Scan(&name, &typ, &def); err != nil {
			t.Fatal(err)
		}
		cons[name] = typ + " " + def
	}
	if err := crows.Err(); err != nil {
		t.Fatal(err)
	}
	for name, def := range map[string]string{
		"im_message_pkey": "p PRIMARY KEY (msg_id)",
		"uk_conv_seq":     "u UNIQUE (conv_id, seq)",
		"uk_from_client":  "u UNIQUE (from_uid, client_msg_id)",
	} {
		if cons[name] != def {
			t.Fatalf("constraint %s = %q, want %q (all: %v)", name, cons[name], def, cons)
		}
	}
	var workers int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM worker_lease`).Scan(&workers); err != nil || workers != 1024 {
		t.Fatalf("worker_lease rows = %d, %v", workers, err)
	}
}

func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	stores := []*Store{openStore(t, dsn), openStore(t, dsn), openStore(t, dsn)}
	var wg sync.WaitGroup
	errs := make([]error, len(stores))
	for i, s := range stores {
		wg.Add(1)
		go func(i int, s *Store) {
			defer wg.Done()
			errs[i] = s.Migrate(ctx)
		}(i, s)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate %d: %v", i, err)
		}
	}
	if err := stores[0].Migrate(ctx); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	ms, err := Migrations()
	if err != nil || len(ms) == 0 || ms[0].Version != 1 {
		t.Fatalf("migrations %+v, %v", ms, err)
	}
	var n, max int
	if err := stores[0].pool.QueryRow(ctx, `SELECT count(*), max(version) FROM schema_version`).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != len(ms) || max != ms[len(ms)-1].Version {
		t.Fatalf("schema_version holds %d rows up to %d, want %d up to %d", n, max, len(ms), ms[len(ms)-1].Version)
	}
	if v, err := stores[1].SchemaVersion(ctx); err != nil || v != max {
		t.Fatalf("SchemaVersion = %d, %v", v, err)
	}
}

func TestOpenUnreachableIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = Open(context.Background(), "postgres://postgres@"+addr+"/x?connect_timeout=2", Options{})
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("open of a dead address: %v, want ErrStoreUnavailable", err)
	}
}

func msgs(conv string, prev uint64, n int, firstID uint64) persist.ConvBatch {
	return storetest.Rows(conv, prev, n, firstID)
}

// TestFenceWaitsForEpochBump: while another transaction is moving a
// partition to a new epoch, a commit fenced with the old epoch waits for it
// and then fails as stale; it never lands under the old epoch.
func TestFenceWaitsForEpochBump(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.PutPartitionLeaseForTest(ctx, persist.Fence{Partition: 3, Owner: "a", Epoch: 5}); err != nil {
		t.Fatal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE partition_lease SET owner = 'b', epoch = 6 WHERE partition = 3`); err != nil {
		t.Fatal(err)
	}
	b := msgs("conv-fenced", 0, 2, 100)
	b.Fence = persist.Fence{Partition: 3, Owner: "a", Epoch: 5}
	done := make(chan error, 1)
	go func() { done <- s.Commit(ctx, []persist.ConvBatch{b}) }()
	// Wait until the commit is blocked on the lease row lock.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("fenced commit finished while the epoch bump was open: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("fenced commit never waited for the epoch bump")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, sequencer.ErrStaleEpoch) {
		t.Fatalf("fenced commit after the bump: %v, want ErrStaleEpoch", err)
	}
	if h, _ := s.LoadHead(ctx, "conv-fenced"); h != 0 {
		t.Fatalf("head = %d after a stale commit", h)
	}
}

// cutProxy forwards TCP to target. When armed, it watches the client's bytes
// for trigger; on seeing it, it forwards the chunk to the server or not
// (forward), then cuts both connections without relaying an answer.
type cutProxy struct {
	l       net.Listener
	target  string
	mu      sync.Mutex
	trigger []byte
	forward bool
	fired   chan struct{}
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, target: target}
	t.Cleanup(func() { l.Close() })
	go p.serve()
	return p
}

func (p *cutProxy) arm(trigger string, forward bool) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger, p.forward, p.fired = []byte(trigger), forward, make(chan struct{})
	return p.fired
}

func (p *cutProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		go func() { _, _ = io.Copy(c, s); c.Close() }()
		go func() {
			defer s.Close()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					p.mu.Lock()
					trig, fwd, fired := p.trigger, p.forward, p.fired
					hit := trig != nil && bytes.Contains(buf[:n], trig)
					if hit {
						p.trigger = nil
					}
					p.mu.Unlock()
					if hit {
						// Cut the client first, so no answer can reach it.
						c.Close()
						if fwd {
							_, _ = s.Write(buf[:n])
						}
						close(fired)
						return
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func proxiedStore(t *testing.T) (direct, viaProxy *Store, p *cutProxy) {
	direct, dsn := newStore(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p = newCutProxy(t, net.JoinHostPort(cfg.Host, itoa(int(cfg.Port))))
	pdsn, err := replaceHostPort(dsn, p.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return direct, openStore(t, pdsn), p
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

func replaceHostPort(dsn, hostport string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	return "postgres://" + cfg.User + "@" + hostport + "/" + cfg.Database + "?sslmode=disable", nil
}

// TestCommitErrorClasses cuts the connection at different points of a
// commit and checks the error class, and what landed, against persist.Store's
// contract. A small commit is one pipelined batch ending in COMMIT, so a cut
// once that batch is written is an unknown outcome whether or not the server
// got it; a large (COPY) commit sends COMMIT last, so a cut while the rows
// are on the way is ErrStoreUnavailable.
func TestCommitErrorClasses(t *testing.T) {
	ctx := context.Background()
	direct, via, p := proxiedStore(t)
	if err := via.Commit(ctx, []persist.ConvBatch{msgs("warm", 0, 1, 1)}); err != nil {
		t.Fatalf("commit through the proxy: %v", err)
	}

	// The batch (BEGIN .. COMMIT) never reaches the server: unknown to the
	// caller, and nothing landed.
	fired := p.arm("lost-batch", false)
	err := via.Commit(ctx, []persist.ConvBatch{msgs("lost-batch", 0, 3, 10)})
	<-fired
	if !errors.Is(err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("batch lost on the way: %v, want ErrUnknownOutcome", err)
	}
	waitNoOtherBackends(t, direct)
	if h, err := direct.LoadHead(ctx, "lost-batch"); err != nil || h != 0 {
		t.Fatalf("head after a lost batch = %d, %v", h, err)
	}

	// The batch reaches the server and the connection is lost before the
	// answer: unknown. Whether it landed depends on how far the server got
	// before it saw the connection gone (it may abort before COMMIT), so the
	// check is the contract's: all of it or none of it, once the server
	// session is gone.
	fired = p.arm("landed", true)
	err = via.Commit(ctx, []persist.ConvBatch{msgs("landed", 0, 3, 20)})
	<-fired
	if !errors.Is(err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("cut after the batch was sent: %v, want ErrUnknownOutcome", err)
	}
	if sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("unknown outcome code %v", sequencer.ErrorCode(err))
	}
	waitNoOtherBackends(t, direct)
	h, err := direct.LoadHead(ctx, "landed")
	if err != nil || (h != 0 && h != 3) {
		t.Fatalf("head after an unknown outcome = %d, %v: want 0 or 3 (all or nothing)", h, err)
	}
	if rows, err := direct.ReadRange(ctx, "landed", 0, 10); err != nil || uint64(len(rows)) != h {
		t.Fatalf("after an unknown outcome: head %d but %d rows (%v)", h, len(rows), err)
	}
	t.Logf("the commit whose answer was lost landed: %v", h == 3)

	// COPY path: cut before COMMIT (the proxy sees the conversation id in
	// the first round trip, BEGIN and the checks): nothing written.
	via.mode = insertCopy
	fired = p.arm("cut-in-copy", false)
	err = via.Commit(ctx, []persist.ConvBatch{msgs("cut-in-copy", 0, 3, 30)})
	<-fired
	if !errors.Is(err, sequencer.ErrStoreUnavailable) || errors.Is(err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("cut before COMMIT (COPY path): %v, want ErrStoreUnavailable", err)
	}
	waitNoOtherBackends(t, direct)
	if h, err := direct.LoadHead(ctx, "cut-in-copy"); err != nil || h != 0 {
		t.Fatalf("head after a cut before COMMIT (COPY path) = %d, %v", h, err)
	}

	// COPY path: COMMIT sent and the connection lost before the answer:
	// unknown, and it landed.
	fired = p.arm("COMMIT\x00", true)
	err = via.Commit(ctx, []persist.ConvBatch{msgs("copy-landed", 0, 3, 40)})
	<-fired
	if !errors.Is(err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("COPY path, cut after COMMIT was sent: %v, want ErrUnknownOutcome", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		h, err := direct.LoadHead(ctx, "copy-landed")
		if err == nil && h == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the COPY commit whose answer was lost never showed up: head %d, %v", h, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	via.mode = insertAuto

	// The store recovers: the next commit goes through.
	if err := via.Commit(ctx, []persist.ConvBatch{msgs("after", 0, 1, 50)}); err != nil {
		t.Fatalf("commit after the cuts: %v", err)
	}
}

// TestRefusalsLeaveConnectionUsable: a refused one-round-trip commit (head
// mismatch, stale fence, conflict) aborts its transaction on the server; the
// store rolls it back and the next commit on the same pool works, and a
// refusal never reports an unknown outcome.
func TestRefusalsLeaveConnectionUsable(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.PutPartitionLeaseForTest(ctx, persist.Fence{Partition: 1, Owner: "n", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	first := msgs("r", 0, 2, 1)
	first.Fence = persist.Fence{Partition: 1, Owner: "n", Epoch: 2} // the database holds a lease: commits must be fenced
	if err := s.Commit(ctx, []persist.ConvBatch{first}); err != nil {
		t.Fatal(err)
	}
	stale := msgs("s", 0, 1, 10)
	stale.Fence = persist.Fence{Partition: 1, Owner: "n", Epoch: 1}
	held := func(b persist.ConvBatch) persist.ConvBatch { b.Fence = first.Fence; return b }
	dup := held(msgs("d", 0, 1, 20))
	dup.Messages[0].MsgID = first.Messages[0].MsgID
	for _, bad := range []persist.ConvBatch{held(msgs("r", 5, 1, 30)), stale, dup} {
		for i := 0; i < 3; i++ { // more than the pool's idle connections see
			err := s.Commit(ctx, []persist.ConvBatch{bad})
			var hm *persist.HeadMismatchError
			var sf *persist.StaleFenceError
			_, isConflict := persist.AsConflict(err)
			if !errors.As(err, &hm) && !errors.As(err, &sf) && !isConflict {
				t.Fatalf("bad commit of %q: %v, want a refusal", bad.ConvID, err)
			}
			if errors.Is(err, sequencer.ErrUnknownOutcome) {
				t.Fatalf("refusal reported as unknown outcome: %v", err)
			}
		}
	}
	if err := s.Commit(ctx, []persist.ConvBatch{held(msgs("r", 2, 1, 40))}); err != nil {
		t.Fatalf("commit after refusals: %v", err)
	}
	if h, err := s.LoadHead(ctx, "r"); err != nil || h != 3 {
		t.Fatalf("head = %d, %v", h, err)
	}
}

// waitNoOtherBackends waits until no backend of this database is inside a
// transaction except ours.
func waitNoOtherBackends(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends still in a transaction", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCommitCanceledBeforeIsUnavailable(t *testing.T) {
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Commit(ctx, []persist.ConvBatch{msgs("c", 0, 1, 1)})
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("commit with a done context: %v, want ErrStoreUnavailable", err)
	}
	if h, err := s.LoadHead(context.Background(), "c"); err != nil || h != 0 {
		t.Fatalf("head = %d, %v", h, err)
	}
}

// TestCommitAfterBackendsKilled: connections the server terminated fail the
// commit (or read) as unavailable (nothing written), and the pools recover.
func TestCommitAfterBackendsKilled(t *testing.T) {
	s, dsn := newStore(t)
	ctx := context.Background()
	if err := s.Commit(ctx, []persist.ConvBatch{msgs("k", 0, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	admin := openStore(t, dsn)
	if _, err := admin.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	var errs []error
	for i := 0; i < 10; i++ {
		err := s.Commit(ctx, []persist.ConvBatch{msgs("k", 1, 1, uint64(10+i))})
		if err == nil {
			break
		}
		if !errors.Is(err, sequencer.ErrStoreUnavailable) {
			t.Fatalf("commit on a killed connection: %v, want ErrStoreUnavailable", err)
		}
		errs = append(errs, err)
	}
	// The read pool's connections were terminated too: each fails one read
	// as unavailable, then the pool has new ones.
	var h uint64
	var err error
	for i := 0; i < 10; i++ {
		if h, err = s.LoadHead(ctx, "k"); err == nil || !errors.Is(err, sequencer.ErrStoreUnavailable) {
			break
		}
		errs = append(errs, err)
	}
	if err != nil || h != 2 {
		t.Fatalf("head after recovery = %d, %v (errors on the way: %v)", h, err, errs)
	}
}

// TestConflictReportIsComplete: several rows hitting stored keys are all
// reported, in a stable order.
func TestConflictReportIsComplete(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	first := msgs("a", 0, 3, 1)
	if err := s.Commit(ctx, []persist.ConvBatch{first}); err != nil {
		t.Fatal(err)
	}
	b := msgs("b", 0, 3, 11)
	b.Messages[0].MsgID = first.Messages[2].MsgID
	b.Messages[2].ClientMsgID = first.Messages[1].ClientMsgID
	ce, ok := persist.AsConflict(s.Commit(ctx, []persist.ConvBatch{b}))
	if !ok || len(ce.Conflicts) != 2 {
		t.Fatalf("conflicts %+v", ce)
	}
	keys := []persist.ConflictKey{ce.Conflicts[0].Key, ce.Conflicts[1].Key}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	if keys[0] != persist.KeyClientMsgID || keys[1] != persist.KeyMsgID {
		t.Fatalf("conflict keys %v", keys)
	}
}

// TestLargeCommit goes through the COPY path of the default mode: a commit of
// copyMinRows+ rows lands, and one with a taken resend key among them is a
// ConflictError naming that row, with nothing written.
func TestLargeCommit(t *testing.T) {
	s, _ := newStore(t)
	storetest.LargeCommits(t, s, []string{"big-0", "big-1", "big-2"}, copyMinRows/2)
}

// A session left idle inside a transaction (its process frozen mid-way) is
// terminated by the server after IdleInTxTimeout, so its locks do not stall
// the live nodes.
func TestFrozenTransactionIsTerminated(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	s, err := Open(ctx, dsn, Options{IdleInTxTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM conv_head FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// The "frozen" session now sits idle in its transaction.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session idle in its transaction was not terminated")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("the terminated transaction still answers")
	}
}

// A migration whose session the server ends (here: the backend terminates
// itself, as idle_in_transaction_session_timeout or a restart would) fails
// as unavailable, which persist/open retries; one the server refuses does
// not, and neither is recorded.
func TestMigrationErrorsSayWhetherToRetry(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	lost := Migration{Version: 9001, Name: "9001_session_ends", SQL: "SELECT pg_terminate_backend(pg_backend_pid())"}
	err := s.apply(ctx, lost, false)
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("a migration whose session ended: %v, want store unavailable", err)
	}
	refused := Migration{Version: 9002, Name: "9002_refused", SQL: "SELECT 1/0"}
	err = s.apply(ctx, refused, false)
	if err == nil || errors.Is(err, sequencer.ErrStoreUnavailable) || !strings.Contains(err.Error(), "9002_refused") {
		t.Fatalf("a refused migration: %v, want its error, not unavailable", err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v >= 9001 {
		t.Fatalf("schema version %d (%v): a failed migration was recorded", v, err)
	}
}
