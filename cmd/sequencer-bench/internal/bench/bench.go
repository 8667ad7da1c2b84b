// Package bench is the sequencer-bench command (cmd/sequencer-bench; also run
// as `sequencer bench`): it measures this sequencer against the
// seed article's ways of numbering messages, on the same PostgreSQL server and
// the same im_message table, in one run, and writes the results as a table,
// Markdown, JSON and an SVG chart.
//
// It owns the load (senders, conversation choice, latency histograms), the
// baseline engines (Redis INCR, database segment, raw COPY) and the report.
// It creates one fresh database per run (one schema per engine and scenario,
// so every measurement starts from empty tables) and a random Redis key
// prefix, and removes both at the end. It never touches another database or
// other Redis keys, and it never changes how the engines it measures work.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/internal/conf"
)

// Config is one bench run. Zero fields take the documented defaults.
type Config struct {
	// Engines to measure, by key: a (this sequencer in process), b (Redis
	// INCR + INSERT), c (DB segment + INSERT), d (COPY ceiling), e, e-json,
	// e-batch (`sequencer serve` through the SDK unary, JSON over HTTP/1.1,
	// the SDK batching), and the embedded store's a-sqlite, e-sqlite,
	// e-json-sqlite, e-batch-sqlite. Default: every registered engine; the
	// e engines only with Target or ServeBin, the e-*-sqlite ones only
	// with ServeBin.
	Engines string
	// Scenarios: many, hot, light, skewed, memory. Default
	// "many,hot,light,memory".
	Scenarios string
	// Duration of each measurement (default 10s), after Warmup (default
	// 2s). Messages > 0 ends each run after that many sends instead.
	Duration time.Duration
	Warmup   time.Duration
	Messages int64
	// Senders, Convs and Skew override every selected scenario's values
	// when > 0 (Skew when SkewSet).
	Senders int
	Convs   int
	Skew    float64
	SkewSet bool
	// MemoryConvs overrides the memory scenario's conversations (default
	// 1,000,000; Convs applies when this is 0).
	MemoryConvs int
	// PG is the admin DSN of the PostgreSQL server; the run creates and drops
	// its own database there. Default postgres://postgres@127.0.0.1:5432/postgres.
	PG string
	// CommitWorkers, when > 0, is the in-process engines' group-commit
	// workers instead of the server's default (--commit-workers).
	CommitWorkers int
	// KeepReadPositions runs the sequencer engines with the own-send rule
	// off (--send-marks-read=false): the in-process ones
	// (commit.Config.KeepReadPositions) and the servers the e engines start.
	KeepReadPositions bool
	// MySQL is the admin mysql:// URL of the MySQL / MariaDB server of the
	// -mysql engines; the run creates and drops its databases there.
	MySQL string
	// Citus is the DSN of a Citus coordinator's database (extension
	// created, workers added) for the -citus engines; each scenario gets a
	// fresh schema there, dropped after the run unless Keep. Its servers
	// must run on this machine for the CPU figures.
	Citus string
	// Redis address for engine b. Default 127.0.0.1:6379.
	Redis string
	// Target is the base URL of a running `sequencer serve` for the e
	// engines on PostgreSQL. Without it, they start ServeBin (default: the
	// sequencer binary beside this executable) as `serve` on a fresh schema
	// of the run's database (the -sqlite ones: a fresh SQLite file) for
	// each scenario, like every other engine, and stop it after.
	Target   string
	ServeBin string
	// Protocol the SDK engines (e, e-batch) speak: grpc (default) or connect.
	Protocol string
	// BatchesInFlight is the most SendBatch requests the e-batch engines'
	// SDK keeps in flight (0: the SDK's default).
	BatchesInFlight int
	// SubsProcess: the feed engines' streams in a child process.
	SubsProcess bool
	// SubsCPUProfile: that child process writes its CPU profile here.
	SubsCPUProfile string
	// ConvsPerStream: the feed engines' conversations per Subscribe stream.
	ConvsPerStream int
	// SQLiteDir is where the SQLite engines' files go: a directory
	// seqbench-<run id> inside it, removed at the end unless Keep. Default
	// the system's temporary directory.
	SQLiteDir string
	// Pool is the database connections of engines b and c (default 32,
	// their best measured setting), and of b-mysql and c-mysql. Engine d
	// uses CopyWriters connections;
	// engines a and e use the server's store settings.
	Pool int
	// CopyBatch (default 4000) and CopyWriters (default 4) shape engine d.
	CopyBatch   int
	CopyWriters int
	// BodySize is each message's payload in bytes (default 128).
	BodySize int
	// Passivate is the idle-actor timeout of engine a and of a server the
	// bench starts for engine e (default 5s, so the memory scenario shows
	// passivation in seconds; the server's own default is 30s).
	Passivate time.Duration
	// IdleWait bounds how long the memory scenario waits for passivation
	// (default Passivate*3 + 10s).
	IdleWait time.Duration
	// Report, when set, is the Markdown file to write; FILE.json and
	// FILE.svg are written beside it (a .md suffix is replaced).
	Report string
	// Keep leaves the run's database and Redis keys in place.
	Keep bool
	// Repeat runs every engine on every scenario (but memory) this many
	// times, interleaved, and reports the run with the median throughput
	// (default 1). All runs' throughput and p99 are kept in the JSON.
	Repeat int
	// ProgressEvery is the live line's interval (default 1s; <0 disables).
	ProgressEvery time.Duration
	// MaxRSS stops the memory scenario early when the measured process's
	// resident set passes it (default 8 GiB; the machine is shared).
	MaxRSS uint64
	// CPUProfile, when set, writes a CPU profile of the whole run (engine a
	// runs in this process) to that file.
	CPUProfile string
	// Args is the command line, recorded in the report.
	Args []string
}

func (c *Config) setDefaults() {
	if c.Scenarios == "" {
		c.Scenarios = "many,hot,light,memory"
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Warmup < 0 {
		c.Warmup = 0
	}
	if c.MySQL == "" {
		c.MySQL = defaultMySQL
	}
	if c.PG == "" {
		c.PG = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	if c.Redis == "" {
		c.Redis = "127.0.0.1:6379"
	}
	if c.Protocol == "" {
		c.Protocol = "grpc"
	}
	if c.Pool <= 0 {
		c.Pool = 32
	}
	if c.CopyBatch <= 0 {
		c.CopyBatch = 4000
	}
	if c.CopyWriters <= 0 {
		c.CopyWriters = 4
	}
	if c.BodySize <= 0 {
		c.BodySize = 128
	}
	if c.Passivate <= 0 {
		c.Passivate = 5 * time.Second
	}
	if c.IdleWait <= 0 {
		c.IdleWait = 3*c.Passivate + 10*time.Second
	}
	if c.Repeat <= 0 {
		c.Repeat = 1
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
	if c.Target == "" && c.ServeBin == "" {
		c.ServeBin = selfServeBin()
	}
	if c.SQLiteDir == "" {
		c.SQLiteDir = os.TempDir()
	}
	if c.Engines == "" {
		var keys []string
		for _, k := range engineKeys() {
			s := engines[k]
			switch {
			case s.OptIn:
				continue
			case s.MySQL:
				continue // the -mysql engines run when named (--engines)
			case s.Citus && c.Citus == "":
				continue
			case s.Citus && s.Remote && c.Target == "" && c.ServeBin == "":
				continue
			case !s.Remote:
			case s.SQLite && (c.ServeBin == "" || c.Target != ""):
				continue // the -sqlite e engines start their own server
			case c.Target == "" && c.ServeBin == "":
				continue
			}
			keys = append(keys, k)
		}
		c.Engines = strings.Join(keys, ",")
	}
}

const usageHead = `Usage: sequencer-bench [flags]   (also: sequencer bench [flags])

Measures this sequencer against the seed's ways of numbering messages, on the
same PostgreSQL and the same im_message table, in one run:
  a        this sequencer's engine, in process
  b        Redis INCR seq:conv:{id} (floor saved every 1,000), then one INSERT per message
  c        1,000 seqs per round trip from a segment table, then one INSERT per message
  d        the ceiling: COPY of large batches, no sequencing
  e        'sequencer serve' through the Go SDK, batching off: one gRPC Send per message
  e-json   'sequencer serve' through plain HTTP/1.1 JSON POSTs of Send (like curl)
  e-batch  'sequencer serve' through the Go SDK's auto-batching (SendBatch)
  a-sqlite, e-sqlite, e-json-sqlite, e-batch-sqlite: the same on the embedded store
  r-mark, r-state (and -sqlite): read positions through the Go SDK, one MarkRead or one
           GetReadState of 1,000 conversations per operation (opt-in: name them in --engines)
  x-edit, x-recall (and -sqlite): edits and recalls through the Go SDK, one Edit or one Recall of a
           seeded message per operation (opt-in); x-send (and -sqlite): their baseline, the same
           seeding (32 messages per conversation), then one Send per operation; x-recall-old
           (and -sqlite): Recall of the oldest seeded messages first, those the writer no longer
           remembers (each read from the store before its batch forms)
  a-mysql, e-batch-mysql, b-mysql, c-mysql: a, e-batch, b and c on MySQL / MariaDB
           (--mysql; a fresh database per scenario; run only when named in --engines)
  e-sub, e-batch-sub: e and e-batch with a Subscribe stream on every conversation of the
           scenario (the change feed; opt-in), reporting the feed's deliveries and latency
The change feed's other benches, against a running server:
  sequencer-bench fanout --target URL [--subs 1000] [--pubs 8] [--duration 10s] [--json]
  sequencer-bench pullmany --target URL [--convs 1000] [--msgs 10] [--calls 50]
  (both take --cpuprofile FILE: the subscribers' or callers' side of the run)
The e engines start the sequencer binary beside this one (or --serve-bin) as
'serve' on a fresh store per scenario, or use a running server (--target; not
the -sqlite ones). Their "server CPU us/msg" is the server process's CPU time
(/proc/PID/stat) over the measured window per stored message.
Scenarios: many (1,024 senders, 10,000 conversations), hot (1,024 senders, 1
conversation), light (64 senders), skewed (Zipf 1.1), memory (1,000,000
conversations touched once; in-process/remote actor engines only).

Each run creates a fresh database (seqbench_<random>) on --pg and drops it at
the end (--keep leaves it), and uses Redis keys under a random prefix.

Flags:
`

// Main runs `sequencer bench` with its command-line arguments (without the
// program and subcommand names). It writes the live progress line to stderr
// and the final table to stdout. --help prints usage and returns nil.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if ok, err := feedMain(ctx, args, stdout, stderr); ok {
		return err // fanout, pullmany (feedbench.go)
	}
	cfg := Config{Args: args}
	fs := flag.NewFlagSet("sequencer-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Engines, "engines", "", "engines to measure, comma-separated: "+strings.Join(engineKeys(), ",")+" (default: a,b,c,d,a-sqlite, plus the e engines when a server can be had: --target, --serve-bin or a sequencer binary beside this one)")
	fs.StringVar(&cfg.Scenarios, "scenarios", "many,hot,light,memory", "scenarios, comma-separated: many,hot,light,skewed,memory")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured time of each engine×scenario run (after --warmup)")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "unmeasured load before each measurement (duration mode only)")
	fs.Int64Var(&cfg.Messages, "messages", 0, "if > 0, each run sends exactly this many messages instead of running for --duration")
	fs.IntVar(&cfg.Senders, "senders", 0, "override the scenarios' number of concurrent senders")
	fs.IntVar(&cfg.Convs, "convs", 0, "override the scenarios' number of conversations")
	fs.IntVar(&cfg.MemoryConvs, "memory-convs", 0, "override the memory scenario's conversations (default 1,000,000)")
	skew := fs.Float64("skew", 0, "override the conversation choice: 0 uniform, > 1 Zipf exponent (hot conversations)")
	fs.Var(conf.Not{B: &cfg.KeepReadPositions}, "send-marks-read", "the sequencer engines (a, e and their variants; not with --target): a Send raises its sender's read position in the same transaction, as 'sequencer serve' does by default; false measures without it")
	fs.IntVar(&cfg.CommitWorkers, "commit-workers", 0, "in-process engines (a, a-sqlite, a-mysql): group-commit workers (0: the server's default, as 'sequencer serve' runs)")
	fs.StringVar(&cfg.MySQL, "mysql", defaultMySQL, "admin mysql:// URL of the MySQL / MariaDB server of the -mysql engines (the run creates its own databases there)")
	fs.StringVar(&cfg.PG, "pg", "postgres://postgres@127.0.0.1:5432/postgres", "admin DSN of the PostgreSQL server (the run creates its own database there)")
	fs.StringVar(&cfg.Citus, "citus", "", "the -citus engines (a-citus, e-batch-citus): DSN of a Citus coordinator's database with its workers added (scripts/citus.sh start + createdb); each scenario gets a fresh schema there, with the DSN's citus.shard_count (options=-c citus.shard_count=N)")
	fs.StringVar(&cfg.Redis, "redis", "127.0.0.1:6379", "Redis address (engine b)")
	fs.StringVar(&cfg.Target, "target", "", "base URL of a running 'sequencer serve' for the e engines on PostgreSQL, e.g. http://127.0.0.1:7070")
	fs.StringVar(&cfg.ServeBin, "serve-bin", "", "without --target: the sequencer binary the e engines start as 'serve' on a fresh store per scenario (default: sequencer beside this executable)")
	fs.StringVar(&cfg.Protocol, "protocol", "grpc", "the SDK engines' (e, e-batch) protocol over HTTP/2 cleartext: grpc or connect")
	fs.IntVar(&cfg.BatchesInFlight, "batches-in-flight", 0, "the e-batch engines: most SendBatch requests in flight to the node (0: the Go SDK's default, client.DefaultBatchMaxInFlight)")
	fs.BoolVar(&cfg.SubsProcess, "subs-process", false, "the feed engines (e-sub, e-batch-sub): open the Subscribe streams in a child process of the bench instead of beside the senders (the feed's latency is then not measured)")
	fs.IntVar(&cfg.ConvsPerStream, "convs-per-stream", 1, "the feed engines (e-sub, e-batch-sub): conversations per Subscribe stream (1: a stream on each conversation; 1,000: ten streams for many's 10,000, as a push gateway holding many conversations would)")
	fs.StringVar(&cfg.SubsCPUProfile, "subs-cpuprofile", "", "with --subs-process: the streams' child process writes its CPU profile (the whole run) to this file")
	fs.StringVar(&cfg.SQLiteDir, "sqlite-dir", "", "where the -sqlite engines' files go (a seqbench-<run id> directory inside, removed at the end unless --keep; default: the system's temporary directory; use a disk, not tmpfs)")
	fs.IntVar(&cfg.Pool, "pool", 32, "database connections of engines b and c (PostgreSQL) and b-mysql and c-mysql (a and e run with the server's own store settings)")
	fs.IntVar(&cfg.CopyBatch, "copy-batch", 4000, "engine d: most rows per COPY")
	fs.IntVar(&cfg.CopyWriters, "copy-writers", 4, "engine d: concurrent COPY connections")
	fs.IntVar(&cfg.BodySize, "body", 128, "message body size in bytes")
	fs.DurationVar(&cfg.Passivate, "passivate", 5*time.Second, "engines a and e (when the bench starts the server), and their -sqlite variants: idle time after which a conversation actor stops")
	fs.DurationVar(&cfg.IdleWait, "idle-wait", 0, "memory scenario: how long to wait for passivation (default 3×passivate+10s)")
	fs.IntVar(&cfg.Repeat, "repeat", 1, "run every engine×scenario (but memory) this many times, interleaved, each round starting one engine later; report the median-throughput run")
	render := fs.String("render", "", "do not measure: re-render the Markdown and SVG of a saved report from its JSON FILE (to --report, default beside it)")
	fs.StringVar(&cfg.Report, "report", "", "write Markdown to FILE and FILE.json, FILE.svg beside it")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the run's database and Redis keys")
	fs.DurationVar(&cfg.ProgressEvery, "progress", time.Second, "interval of the live progress line (negative: off)")
	maxRSSMiB := fs.Uint64("max-rss-mib", 8192, "memory scenario: stop early when the measured process's RSS passes this many MiB (0: no limit)")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of the bench process (engine a runs in it; the e engines' servers do not) to FILE")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *render != "" {
		return renderSaved(*render, cfg.Report, stdout)
	}
	cfg.MaxRSS = *maxRSSMiB << 20
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "skew" {
			cfg.Skew, cfg.SkewSet = *skew, true
		}
	})
	return Run(ctx, cfg, stdout, stderr)
}

// Run measures every selected engine on every selected scenario and reports.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	cfg.setDefaults()
	specs, err := parseEngines(cfg.Engines)
	if err != nil {
		return err
	}
	scenarios, err := parseScenarios(cfg.Scenarios, scenarioOverrides{
		Senders: cfg.Senders, Convs: cfg.Convs, MemoryConvs: cfg.MemoryConvs, Skew: cfg.Skew, SkewSet: cfg.SkewSet,
		Duration: cfg.Duration, Messages: cfg.Messages, Warmup: cfg.Warmup,
	})
	if err != nil {
		return err
	}
	if cfg.Protocol != "grpc" && cfg.Protocol != "connect" {
		return fmt.Errorf("--protocol must be grpc or connect, got %q", cfg.Protocol)
	}
	if cfg.BatchesInFlight < 0 || cfg.BatchesInFlight > 64 {
		return fmt.Errorf("--batches-in-flight must be 0..64, got %d", cfg.BatchesInFlight)
	}
	if cfg.ConvsPerStream < 1 || cfg.ConvsPerStream > api.MaxSubscribeCursors {
		return fmt.Errorf("--convs-per-stream must be 1..%d, got %d", api.MaxSubscribeCursors, cfg.ConvsPerStream)
	}
	needRedis, needPG, needSQLite, needMySQL := false, false, false, false
	for i, s := range specs {
		if s.Key == "b" || s.Key == "b-mysql" {
			needRedis = true
		}
		if s.Remote && s.MySQL && cfg.Target != "" {
			return fmt.Errorf("engine %s starts its own server on a MySQL database; it does not run against --target", s.Key)
		}
		needMySQL = needMySQL || s.MySQL
		if s.Remote && s.SQLite && cfg.Target != "" {
			return fmt.Errorf("engine %s starts its own server on a SQLite file; it does not run against --target (leave it out, or drop --target and give --serve-bin)", s.Key)
		}
		if s.Remote && cfg.Target == "" {
			if cfg.ServeBin == "" {
				return fmt.Errorf("engine %s needs --target http://HOST:PORT of a running 'sequencer serve', or --serve-bin PATH to start one (none found beside this executable; make build puts bin/sequencer there)", s.Key)
			}
			specs[i] = servedSpec(s)
			s = specs[i]
		}
		needPG = needPG || s.NeedsSchema
		needSQLite = needSQLite || s.SQLite
	}

	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	runID := randomID()
	r := &runner{cfg: cfg, runID: runID, stderr: stderr, tty: isTerminal(stderr)}
	r.info = collectRunInfo(cfg)
	r.info.RunID = runID

	if needPG {
		db, err := createBenchDB(ctx, cfg.PG, runID)
		if err != nil {
			return err
		}
		r.db = db
		r.info.Database = db.Name
		defer func() {
			if cfg.Keep {
				fmt.Fprintf(stderr, "kept database %s\n", db.Name)
				return
			}
			if err := db.Drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
			}
		}()
		if info, err := db.serverInfo(ctx); err == nil {
			r.info.PostgreSQL = info
		} else {
			fmt.Fprintf(stderr, "bench: reading PostgreSQL settings: %v\n", err)
		}
	}
	if needMySQL {
		my := &myBench{admin: cfg.MySQL, runID: runID}
		info, err := my.serverInfo(ctx)
		if err != nil {
			return fmt.Errorf("mysql at %s: %w", redactMySQL(cfg.MySQL), err)
		}
		r.my, r.info.MySQL = my, info
		defer func() {
			if cfg.Keep {
				fmt.Fprintf(stderr, "kept MySQL databases seqbench_%s_*\n", runID)
				return
			}
			if err := my.Drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
			}
		}()
	}
	if needSQLite {
		dir := filepath.Join(cfg.SQLiteDir, "seqbench-"+runID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("sqlite directory: %w", err)
		}
		r.sqliteDir = dir
		r.info.SQLiteDir = dir
		r.info.SQLiteFS = fsType(dir)
		if r.info.SQLiteFS == "tmpfs" {
			r.logf("the SQLite files are on tmpfs (%s): fsync costs nothing there, so the -sqlite engines are not durable and their numbers flatter them; use --sqlite-dir on a disk", dir)
		}
		defer func() {
			if cfg.Keep {
				fmt.Fprintf(stderr, "kept SQLite files in %s\n", dir)
				return
			}
			if err := os.RemoveAll(dir); err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
			}
		}()
	}
	if needRedis {
		r.redis = redis.NewClient(&redis.Options{Addr: cfg.Redis, PoolSize: max(cfg.Pool, 64)})
		defer r.redis.Close()
		if err := r.redis.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis at %s: %w", cfg.Redis, err)
		}
		r.redisPrefix = "seqbench:" + runID + ":"
		r.info.Redis = redisVersion(ctx, r.redis)
		defer func() {
			if cfg.Keep {
				fmt.Fprintf(stderr, "kept Redis keys %s*\n", r.redisPrefix)
				return
			}
			if err := deleteRedisPrefix(context.WithoutCancel(ctx), r.redis, r.redisPrefix); err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
			}
		}()
	}

	// Repeats are interleaved (every engine and scenario once, then again),
	// so a burst of load from other processes hits all engines alike, and
	// each round starts one engine later than the one before (a, b, c, then
	// b, c, a, ...), so no engine always runs first on a fresh machine or
	// right after the same neighbour. The memory scenario runs once.
	runs := map[string][]Result{}
	var failed []error
	for rep := 0; rep < cfg.Repeat; rep++ {
		for _, sc := range scenarios {
			if sc.TouchOnce && rep > 0 {
				continue
			}
			for _, spec := range roundOrder(specs, rep) {
				if ctx.Err() != nil {
					break
				}
				res, err := r.runOne(ctx, spec, sc, rep)
				if err != nil {
					// One engine failing (a server that did not start,
					// Redis gone) does not lose the other measurements.
					err = fmt.Errorf("engine %s, scenario %s: %w", spec.Key, sc.Name, err)
					failed = append(failed, err)
					res.Skipped = "failed: " + err.Error()
				}
				key := spec.Key + "/" + sc.Name
				runs[key] = append(runs[key], res)
				fmt.Fprintln(stderr, summaryLine(res))
			}
		}
	}
	var results []Result
	for _, sc := range scenarios {
		for _, spec := range specs {
			if rs := runs[spec.Key+"/"+sc.Name]; len(rs) > 0 {
				results = append(results, medianRun(rs))
			}
		}
	}
	r.info.Finished = time.Now().UTC()
	rep := &Report{Info: r.info, Engines: engineInfos(specs), Scenarios: scenarioInfos(scenarios), Results: results}
	rep.Targets = checkTargets(results)
	fmt.Fprintln(stdout)
	writeTextTable(stdout, rep)
	if cfg.Report != "" {
		files, err := rep.WriteFiles(cfg.Report)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nreport: %s\n", strings.Join(files, ", "))
	}
	if ctx.Err() != nil {
		failed = append(failed, fmt.Errorf("interrupted: %w", ctx.Err()))
	}
	return errors.Join(failed...)
}

// roundOrder is the order of the engines in round rep: specs rotated left
// by rep.
func roundOrder(specs []EngineSpec, rep int) []EngineSpec {
	if len(specs) == 0 {
		return nil
	}
	k := rep % len(specs)
	return append(append([]EngineSpec(nil), specs[k:]...), specs[:k]...)
}

// runner holds what every (engine, scenario) run shares.
type runner struct {
	cfg         Config
	runID       string
	info        RunInfo
	db          *benchDB
	redis       *redis.Client
	redisPrefix string
	sqliteDir   string   // the -sqlite engines' files, one per engine and scenario
	my          *myBench // the -mysql engines' server
	stderr      io.Writer
	tty         bool
	body        []byte
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.stderr, "bench: "+format+"\n", args...)
}

// runOne opens spec's engine on a fresh schema, runs sc against it, and
// closes it.
func (r *runner) runOne(ctx context.Context, spec EngineSpec, sc Scenario, rep int) (Result, error) {
	res := Result{Engine: spec.Key, EngineName: spec.Name, Scenario: sc.Name, Senders: sc.Senders, Convs: sc.Convs, Skew: sc.Skew, LoadAvg: loadAvg1()}
	if r.body == nil {
		r.body = make([]byte, r.cfg.BodySize)
		_, _ = rand.Read(r.body)
	}
	// Every run has its own names: a repeat starts on fresh conversations,
	// resend keys and Redis counters, like on a fresh schema.
	runName := sc.Name
	if rep > 0 {
		runName += fmt.Sprintf("%d", rep+1)
	}
	env := Env{
		Pool: r.cfg.Pool, Redis: r.redis, RedisPrefix: r.redisPrefix + spec.Key + ":" + runName + ":",
		Target: r.cfg.Target, ServeBin: r.cfg.ServeBin, Protocol: r.cfg.Protocol, BatchesInFlight: r.cfg.BatchesInFlight, SubsProcess: r.cfg.SubsProcess, SubsCPUProfile: r.cfg.SubsCPUProfile, ConvsPerStream: r.cfg.ConvsPerStream, CopyBatch: r.cfg.CopyBatch, CopyWriters: r.cfg.CopyWriters,
		Passivate: r.cfg.Passivate, CommitWorkers: r.cfg.CommitWorkers, KeepReadPositions: r.cfg.KeepReadPositions, Logf: r.logf,
	}
	// One store per engine, scenario and repeat: a schema (e-json, many,
	// 2nd run: e_json_many_r2) or a SQLite file of that name.
	schema := strings.ReplaceAll(spec.Key, "-", "_") + "_" + sc.Name
	if rep > 0 {
		schema += fmt.Sprintf("_r%d", rep+1)
	}
	if spec.SQLite {
		env.DSN = "sqlite:" + filepath.Join(r.sqliteDir, schema+".db")
	}
	if spec.MySQL {
		dsn, err := r.my.NewDatabase(ctx, schema)
		if err != nil {
			return res, err
		}
		env.DSN = dsn
		if spec.NeedsBaselineTables {
			if err := baselineTables(ctx, dsn); err != nil {
				return res, err
			}
		}
	}
	if spec.Citus {
		if r.cfg.Citus == "" {
			return res, fmt.Errorf("engine %s needs --citus", spec.Key)
		}
		cdb := &benchDB{DSN: r.cfg.Citus}
		dsn, err := cdb.NewSchema(ctx, schema)
		if err != nil {
			return res, err
		}
		env.DSN = dsn
		if !r.cfg.Keep {
			defer func() {
				if err := cdb.exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
					r.logf("drop Citus schema %s: %v", schema, err)
				}
			}()
		}
		if err := checkpointNodes(ctx, r.cfg.Citus, true); err != nil && !r.info.checkpointWarned {
			r.info.checkpointWarned = true
			r.logf("CHECKPOINT on the Citus nodes before each run failed (needs superuser or pg_checkpoint); runs may pay for earlier runs' dirty pages: %v", err)
		}
	} else if spec.NeedsSchema {
		dsn, err := r.db.NewSchema(ctx, schema)
		if err != nil {
			return res, err
		}
		env.DSN = dsn
		if spec.NeedsBaselineTables {
			initDDL, err := messageDDL()
			if err != nil {
				return res, err
			}
			ddl := []string{initDDL, floorDDL, segmentDDL}
			schemaDB := *r.db
			schemaDB.DSN = dsn
			if err := schemaDB.exec(ctx, ddl...); err != nil {
				return res, err
			}
		}
		if err := r.db.Checkpoint(ctx); err != nil && !r.info.checkpointWarned {
			r.info.checkpointWarned = true
			r.logf("CHECKPOINT before each run failed (needs superuser or pg_checkpoint); runs may pay for earlier runs' dirty pages: %v", err)
		}
	}
	eng, err := spec.Open(ctx, env)
	if err != nil {
		return res, fmt.Errorf("open: %w", err)
	}
	defer func() {
		if err := eng.Close(); err != nil {
			r.logf("close engine %s: %v", spec.Key, err)
		}
	}()

	// Conversations are the engine's own: engines that share one server
	// (--target) must not act on each other's (x-recall's recalls would
	// refuse x-edit's edits of the same messages).
	convPfx := r.runID + "-" + spec.Key + "-" + runName + "-"
	if sd, ok := eng.(Seeder); ok {
		if err := sd.Seed(ctx, convPfx, sc.Convs, sc.Senders); err != nil {
			return res, fmt.Errorf("seed: %w", err)
		}
	}

	var probe *memoryProbe
	if sc.TouchOnce {
		conv, ok := eng.(ConvCounter)
		if !ok {
			res.Skipped = "no per-conversation state in memory"
			return res, nil
		}
		probe = &memoryProbe{conv: conv}
		if rm, ok := eng.(RemoteMemory); ok {
			probe.remote = rm
		}
	}

	l := &load{
		eng: eng, sc: sc, body: r.body,
		convPfx: convPfx,
		cmidPfx: convPfx, // the same prefix: the engine's own
		seed:    uint64(time.Now().UnixNano()),
	}
	if r.cfg.ProgressEvery > 0 {
		l.progress = &progress{w: r.stderr, tty: r.tty, interval: r.cfg.ProgressEvery, label: spec.Key + " " + sc.Name}
	}
	var stats0, stats1 BatchStats
	batches, hasBatches := eng.(BatchCounter)
	var cpu0, cpu1 float64
	cpu, hasCPU := eng.(CPUMeter)
	// The PostgreSQL servers' CPU (every process of each postmaster), by
	// server: the run's PostgreSQL, or Citus's coordinator and workers.
	var pgNodesOf []pgNode
	var pg0, pg1 map[string]float64
	if spec.NeedsSchema && !spec.SQLite {
		dsn := r.cfg.PG
		if spec.Citus {
			dsn = r.cfg.Citus
		}
		if ns, err := pgNodes(ctx, dsn, spec.Citus); err != nil {
			r.logf("engine %s: PostgreSQL CPU not measured: %v", spec.Key, err)
		} else {
			pgNodesOf = ns
		}
	}
	feedMeter, hasFeed := eng.(FeedMeter)
	onMeasure := func(start bool) {
		if hasFeed && start {
			feedMeter.FeedStart()
		}
		if pgNodesOf != nil {
			v, err := pgCPU(pgNodesOf)
			if err != nil {
				r.logf("engine %s PostgreSQL CPU: %v", spec.Key, err)
				pgNodesOf = nil
			} else if start {
				pg0 = v
			} else {
				pg1 = v
			}
		}
		if hasCPU {
			if v, err := cpu.CPUSeconds(ctx); err != nil {
				r.logf("engine %s CPU time: %v", spec.Key, err)
				hasCPU = false
			} else if start {
				cpu0 = v
			} else {
				cpu1 = v
			}
		}
		if !hasBatches {
			return
		}
		st, err := batches.Batches(ctx)
		if err != nil {
			r.logf("engine %s batch counters: %v", spec.Key, err)
			hasBatches = false
			return
		}
		if start {
			stats0 = st
		} else {
			stats1 = st
		}
	}

	var mem *MemoryResult
	if probe != nil {
		probe.maxRSS = r.cfg.MaxRSS
		probe.onLimit = func() {
			r.logf("memory scenario: RSS passed %s; stopping the load early", fmtBytes(r.cfg.MaxRSS))
			l.stop.Store(true)
		}
		mem = &MemoryResult{Conversations: sc.Convs, Remote: probe.remote != nil}
		mem.HeapBefore = probe.heapNow(ctx)
		if live, err := probe.conv.LiveConversations(ctx); err == nil {
			mem.LiveBefore = live
		}
		probe.start(ctx)
	}
	elapsed, interrupted := l.run(ctx, onMeasure)
	if probe != nil {
		mem.PeakLive, mem.PeakRSS = probe.finish(ctx)
		mem.StoppedAtRSS = probe.limited
		mem.HeapAtEnd = probe.heapNow(ctx)
		if live, err := probe.conv.LiveConversations(ctx); err == nil {
			mem.LiveAtEnd = live
		}
		if added := mem.LiveAtEnd - mem.LiveBefore; added > 0 && mem.HeapAtEnd > mem.HeapBefore {
			mem.BytesPerActor = float64(mem.HeapAtEnd-mem.HeapBefore) / float64(added)
		}
		if probe.remote != nil {
			mem.Note = "server heap as reported by its /metrics (no forced GC): an upper bound"
		}
		if !interrupted {
			live, waited := probe.waitIdle(ctx, r.cfg.IdleWait)
			mem.LiveAfterIdle, mem.IdleSeconds = live, waited.Seconds()
			mem.HeapAfterIdle = probe.heapNow(ctx)
		}
		res.Memory = mem
	}

	res.Seconds = elapsed.Seconds()
	if hasFeed {
		if f := feedMeter.FeedStats(res.Seconds); f.Streams > 0 {
			res.Feed = &f
			if f.InChild {
				r.logf("engine %s %s: %s streams (in a child process) received %s messages (%.0f/s)",
					spec.Key, sc.Name, fmtInt(int64(f.Streams)), fmtInt(f.Delivered), f.PerSecond)
			} else {
				r.logf("engine %s %s: %s streams received %s messages (%.0f/s); latency from the Send's answer to the receipt p50 %.2f ms, p99 %.2f ms",
					spec.Key, sc.Name, fmtInt(int64(f.Streams)), fmtInt(f.Delivered), f.PerSecond, f.Latency.P50, f.Latency.P99)
			}
		}
	}
	res.Messages = l.ok.Load()
	res.Errors = l.errs
	if len(l.errCodes) > 0 {
		res.ErrorCodes = l.errCodes
		res.ErrorSample = l.errSample
	}
	if res.Seconds > 0 {
		res.Throughput = float64(res.Messages) / res.Seconds
	}
	res.Latency = Summarize(l.lat.Snapshot())
	if d := stats1.sub(stats0); hasBatches && d.Commits > 0 {
		res.MeanBatch = float64(d.Messages) / float64(d.Commits)
		res.MeanCommitMs = 1000 * d.CommitSeconds / float64(d.Commits)
	}
	if hasCPU && res.Messages > 0 && cpu1 >= cpu0 {
		res.CPUSeconds = cpu1 - cpu0
		res.CPUUsPerMsg = 1e6 * res.CPUSeconds / float64(res.Messages)
		res.CPUScope = cpu.CPUScope()
	}
	if pgNodesOf != nil && pg0 != nil && pg1 != nil && res.Messages > 0 {
		res.PGCPUUsPerMsgBy = map[string]float64{}
		for _, n := range pgNodesOf {
			us := 1e6 * (pg1[n.Name] - pg0[n.Name]) / float64(res.Messages)
			res.PGCPUUsPerMsgBy[n.Name] = us
			res.PGCPUUsPerMsg += us
		}
	}
	res.Interrupted = interrupted
	return res, nil
}

// renderSaved re-renders a saved JSON report as Markdown, JSON and SVG
// (to out, or beside the JSON when out is empty).
func renderSaved(jsonFile, out string, stdout io.Writer) error {
	b, err := os.ReadFile(jsonFile)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("render %s: %w", jsonFile, err)
	}
	if out == "" {
		out = strings.TrimSuffix(jsonFile, ".json") + ".md"
	}
	for i, info := range rep.Scenarios {
		if s, ok := scenarioDefaults[info.Name]; ok {
			s.Senders, s.Convs, s.Skew = info.Senders, info.Convs, info.Skew
			rep.Scenarios[i].About = s.Describe()
		}
	}
	rep.Targets = checkTargets(rep.Results)
	files, err := rep.WriteFiles(out)
	if err != nil {
		return err
	}
	writeTextTable(stdout, &rep)
	fmt.Fprintf(stdout, "\nreport: %s\n", strings.Join(files, ", "))
	return nil
}

// medianRun returns the measured run with the median throughput (the lower
// middle one for an even count), carrying every run's throughput and p99.
// Failed or skipped runs count only when no run was measured.
func medianRun(rs []Result) Result {
	var ok []Result
	for _, r := range rs {
		if r.Skipped == "" {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return rs[0]
	}
	sorted := slices.Clone(ok)
	slices.SortStableFunc(sorted, func(a, b Result) int { return cmp.Compare(a.Throughput, b.Throughput) })
	m := sorted[(len(sorted)-1)/2]
	if len(rs) > 1 {
		m.RunsThroughput, m.RunsP99, m.RunsPGCPU = nil, nil, nil
		for _, r := range ok {
			m.RunsThroughput = append(m.RunsThroughput, r.Throughput)
			m.RunsP99 = append(m.RunsP99, r.Latency.P99)
			if m.PGCPUUsPerMsg > 0 {
				m.RunsPGCPU = append(m.RunsPGCPU, r.PGCPUUsPerMsg)
			}
		}
		m.FailedRuns = len(rs) - len(ok)
	}
	return m
}

// randomID returns 8 random hex characters.
func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// isTerminal reports whether w is a character device (a terminal), where the
// progress line rewrites itself instead of scrolling.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// loadAvg1 reads the 1-minute load average (0 if unknown).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	_, _ = fmt.Sscan(string(b), &v)
	return v
}

// redisVersion reads redis_version from INFO server.
func redisVersion(ctx context.Context, c *redis.Client) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

// deleteRedisPrefix removes every key under prefix (SCAN + UNLINK).
func deleteRedisPrefix(ctx context.Context, c *redis.Client, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return fmt.Errorf("scan redis keys %s*: %w", prefix, err)
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return fmt.Errorf("unlink redis keys %s*: %w", prefix, err)
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}
