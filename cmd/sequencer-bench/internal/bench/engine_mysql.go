package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/persist/mysql"
	"github.com/sequencer-im/sequencer/persist/mysql/mysqlurl"
	"github.com/sequencer-im/sequencer/persist/open"
)

// The MySQL engines: this sequencer on persist/mysql (in process, and
// 'sequencer serve' through the SDK's batching) and the seed's two baselines
// on the seed's own MySQL table. Each (engine, scenario) gets a fresh
// database seqbench_<run>_<engine>_<scenario> on the server of --mysql.

func init() {
	registerEngine(EngineSpec{
		Key: "a-mysql", Name: "sequencer, in process, MySQL",
		About: "engine a on persist/mysql (MySQL / MariaDB, InnoDB): group commit of many conversations per transaction, " +
			"fence and head checks inside it",
		MySQL: true, Open: openNode,
	})
	e := remoteSpec("e-batch-mysql", "sequencer serve, SDK batching, MySQL", false,
		"engine e-batch on MySQL: the server runs on --store mysql://... (a fresh database per scenario)", newSDKClient(true))
	e.MySQL = true
	registerEngine(e)
	registerEngine(EngineSpec{
		Key: "b-mysql", Name: "Redis INCR + INSERT, MySQL",
		About: "engine b on the seed's MySQL table: INCR in Redis, then one autocommit INSERT per message",
		MySQL: true, NeedsBaselineTables: true,
		Open: func(ctx context.Context, env Env) (Engine, error) {
			if env.Redis == nil {
				return nil, errors.New("engine b-mysql needs Redis (--redis)")
			}
			w, err := openMyRows(ctx, env)
			if err != nil {
				return nil, err
			}
			ids, err := idgen.New(idgen.Config{WorkerID: 5})
			if err != nil {
				w.Close()
				return nil, err
			}
			return newRedisINCR(w, env, ids), nil
		},
	})
	registerEngine(EngineSpec{
		Key: "c-mysql", Name: "DB segment + INSERT, MySQL",
		About: "engine c on the seed's MySQL table: 1,000 seqs per round trip from a segment table, then one autocommit INSERT per message",
		MySQL: true, NeedsBaselineTables: true,
		Open: func(ctx context.Context, env Env) (Engine, error) {
			w, err := openMyRows(ctx, env)
			if err != nil {
				return nil, err
			}
			ids, err := idgen.New(idgen.Config{WorkerID: 6})
			if err != nil {
				w.Close()
				return nil, err
			}
			return &segmentEngine{rowStore: w, ids: ids}, nil
		},
	})
}

// defaultMySQL is root over the local MariaDB's unix socket (the test
// harness's default server, persist/mysqltest.DefaultURL; the bench binary
// links no test kit).
const defaultMySQL = "mysql://root@localhost/mysql?socket=/run/mysqld/mysqld.sock"

// redactMySQL hides a mysql:// URL's password.
func redactMySQL(raw string) string { return open.Redact(raw) }

// baselineTables creates the baselines' tables in the database of rawURL:
// im_message as the MySQL store creates it, by applying the store's own
// first migration (persist/mysql/migrations/0001_init.sql: the seed's
// table, plus the store's heads and lease tables, which the baselines leave
// empty; the same body type and binary key collation as engine a-mysql
// gets), and the baselines' own side tables. No copy of the schema lives
// here.
func baselineTables(ctx context.Context, rawURL string) error {
	st, err := mysql.Open(ctx, rawURL, mysql.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.MigrateTo(ctx, 1); err != nil {
		return fmt.Errorf("the MySQL store's first migration: %w", err)
	}
	db, err := openMySQL(rawURL, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, ddl := range []string{
		`CREATE TABLE seq_floor (conv_id VARCHAR(64) PRIMARY KEY, floor BIGINT NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE seq_segment (conv_id VARCHAR(64) PRIMARY KEY, max_seq BIGINT NOT NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("%s: %w", firstLine(ddl), err)
		}
	}
	return nil
}

// openMySQL opens database/sql on a mysql:// URL.
func openMySQL(rawURL string, size int) (*sql.DB, error) {
	cfg, err := mysqlurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = true, time.UTC, true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	c, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	if size > 0 {
		db.SetMaxOpenConns(size)
		db.SetMaxIdleConns(size)
	}
	return db, nil
}

// myBench is the MySQL server of a run: it creates a database per (engine,
// scenario), through the MySQL test harness, and drops them at the end.
type myBench struct {
	admin string
	runID string
	dbs   []string
}

// NewDatabase creates seqbench_<run>_<name> and returns its URL.
func (b *myBench) NewDatabase(ctx context.Context, name string) (string, error) {
	db := "seqbench_" + b.runID + "_" + name
	u, err := url.Parse(b.admin)
	if err != nil {
		return "", fmt.Errorf("mysql: admin URL: %w", err)
	}
	if err := b.exec(ctx, "CREATE DATABASE `"+db+"` CHARACTER SET utf8mb4"); err != nil {
		return "", fmt.Errorf("mysql: create database %s: %w", db, err)
	}
	u.Path = "/" + db
	b.dbs = append(b.dbs, db)
	return u.String(), nil
}

// exec runs one statement on the admin database.
func (b *myBench) exec(ctx context.Context, stmt string) error {
	db, err := openMySQL(b.admin, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// Drop drops every database the run created.
func (b *myBench) Drop(ctx context.Context) error {
	var errs []error
	for _, db := range b.dbs {
		if err := b.exec(ctx, "DROP DATABASE IF EXISTS `"+db+"`"); err != nil {
			errs = append(errs, fmt.Errorf("drop database %s: %w", db, err))
		}
	}
	return errors.Join(errs...)
}

// serverInfo describes the server and the settings that decide its
// durability and speed.
func (b *myBench) serverInfo(ctx context.Context) (string, error) {
	db, err := openMySQL(b.admin, 1)
	if err != nil {
		return "", err
	}
	defer db.Close()
	var v, flush, syncBinlog, logBin, pool string
	err = db.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, @@innodb_buffer_pool_size`).
		Scan(&v, &flush, &syncBinlog, &logBin, &pool)
	return fmt.Sprintf("%s innodb_flush_log_at_trx_commit=%s sync_binlog=%s log_bin=%s innodb_buffer_pool_size=%s", v, flush, syncBinlog, logBin, pool), err
}

// myRowWriter is rowWriter on MySQL.
type myRowWriter struct {
	db       *sql.DB
	inserts  atomic.Uint64
	insertNs atomic.Int64
}

func openMyRows(ctx context.Context, env Env) (*myRowWriter, error) {
	db, err := openMySQL(env.DSN, env.Pool)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return &myRowWriter{db: db}, nil
}

func (w *myRowWriter) Batches(context.Context) (BatchStats, error) {
	n := w.inserts.Load()
	return BatchStats{Commits: n, Messages: n, CommitSeconds: time.Duration(w.insertNs.Load()).Seconds()}, nil
}

func (w *myRowWriter) Close() error { return w.db.Close() }

func (w *myRowWriter) insertOne(ctx context.Context, req *sequencer.SendRequest, msgID, seq uint64) (sequencer.SendResult, error) {
	conn, err := w.db.Conn(ctx)
	if err != nil {
		return sequencer.SendResult{}, fmt.Errorf("insert message conv=%s seq=%d: %w", req.ConvID, seq, err)
	}
	at := storedAt().UTC()
	t0 := time.Now() // the commit's own time, not the wait for a connection
	_, err = conn.ExecContext(ctx, `INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, msgID, req.ConvID, seq, req.FromUID, req.MsgType, req.Body, req.ClientMsgID, at)
	conn.Close()
	if err == nil {
		w.insertNs.Add(int64(time.Since(t0)))
		w.inserts.Add(1)
		return sequencer.SendResult{MsgID: msgID, Seq: seq, ServerAt: at}, nil
	}
	var me *gomysql.MySQLError
	if errors.As(err, &me) && me.Number == 1062 && strings.Contains(me.Message, "uk_from_client") {
		var id, s uint64
		var conv string
		var first time.Time
		if err := w.db.QueryRowContext(ctx, `SELECT msg_id, conv_id, seq, server_at FROM im_message WHERE from_uid = ? AND client_msg_id = ?`,
			req.FromUID, req.ClientMsgID).Scan(&id, &conv, &s, &first); err != nil {
			return sequencer.SendResult{}, fmt.Errorf("read first send of %d/%s: %w", req.FromUID, req.ClientMsgID, err)
		}
		if conv != req.ConvID {
			return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeAlreadyExists, sequencer.ErrAlreadyExists,
				fmt.Sprintf("client_msg_id %q of %d used in %s", req.ClientMsgID, req.FromUID, conv))
		}
		return sequencer.SendResult{MsgID: id, Seq: s, ServerAt: first, Duplicate: true}, nil
	}
	return sequencer.SendResult{}, fmt.Errorf("insert message conv=%s seq=%d: %w", req.ConvID, seq, err)
}

func (w *myRowWriter) saveFloor(ctx context.Context, convID string, seq int64) error {
	_, err := w.db.ExecContext(ctx, `INSERT INTO seq_floor (conv_id, floor) VALUES (?, ?)
		ON DUPLICATE KEY UPDATE floor = GREATEST(floor, VALUES(floor))`, convID, seq)
	return err
}

// takeSegment moves the segment and reads its end in one transaction (MySQL
// has no RETURNING on upserts).
func (w *myRowWriter) takeSegment(ctx context.Context, convID string, n int) (int64, error) {
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO seq_segment (conv_id, max_seq) VALUES (?, ?)
		ON DUPLICATE KEY UPDATE max_seq = max_seq + VALUES(max_seq)`, convID, n); err != nil {
		return 0, err
	}
	var last int64
	if err := tx.QueryRowContext(ctx, `SELECT max_seq FROM seq_segment WHERE conv_id = ?`, convID).Scan(&last); err != nil {
		return 0, err
	}
	return last, tx.Commit()
}
