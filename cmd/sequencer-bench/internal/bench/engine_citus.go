package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The Citus engines (issue 20): engine a and e-batch on a Citus cluster
// (--citus: a coordinator database with the citus extension and its workers
// added, e.g. from scripts/citus.sh start and createdb), each scenario on a
// fresh schema of it, next to the single-PostgreSQL engines of the same run.
func init() {
	registerEngine(EngineSpec{
		Key: "a-citus", Name: "sequencer, in process, Citus",
		About:       "engine a on Citus (--citus): the store in distributed mode, each group commit one shard's conversations, sent to the worker holding it",
		NeedsSchema: true, Citus: true,
		Open: openNode,
	})
	e := remoteSpec("e-batch-citus", "sequencer serve, SDK batching, Citus", false,
		"engine e-batch with the server on Citus (--citus)", newSDKClient(true))
	e.Citus = true
	registerEngine(e)
}

// pgNode is one PostgreSQL server whose processes' CPU the bench counts.
type pgNode struct {
	Name string // "postgres", "coordinator", "worker host:port"
	Pid  int    // its postmaster
}

// pgNodes finds the servers behind dsn: its own, and on Citus every worker
// of pg_dist_node (their postmasters found through their data
// directories: the servers must run on this machine).
func pgNodes(ctx context.Context, dsn string, citus bool) ([]pgNode, error) {
	var out []pgNode
	err := forEachNode(ctx, dsn, citus, func(name string, conn *pgx.Conn) error {
		pid, err := postmasterOf(ctx, conn)
		out = append(out, pgNode{Name: name, Pid: pid})
		return err
	})
	return out, err
}

// checkpointNodes runs CHECKPOINT on the server behind dsn and, on Citus,
// on every worker, so that a run does not pay for an earlier run's dirty
// pages (as the single-PostgreSQL runs do not).
func checkpointNodes(ctx context.Context, dsn string, citus bool) error {
	return forEachNode(ctx, dsn, citus, func(name string, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// forEachNode calls fn with a connection to the server behind dsn
// ("postgres", or on Citus "coordinator") and, on Citus, to every primary
// worker of pg_dist_node ("worker HOST:PORT", with dsn's user, password
// and settings).
func forEachNode(ctx context.Context, dsn string, citus bool, fn func(name string, conn *pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	name := "postgres"
	if citus {
		name = "coordinator"
	}
	if err := fn(name, conn); err != nil || !citus {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeport`)
	if err != nil {
		return err
	}
	type hp struct {
		host string
		port int32
	}
	var ws []hp
	for rows.Next() {
		var w hp
		if err := rows.Scan(&w.host, &w.port); err != nil {
			rows.Close()
			return err
		}
		ws = append(ws, w)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	for _, w := range ws {
		c := cfg.Copy()
		c.Host, c.Port = w.host, uint16(w.port)
		wc, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			return err
		}
		err = fn(fmt.Sprintf("worker %s:%d", w.host, w.port), wc)
		wc.Close(ctx)
		if err != nil {
			return err
		}
	}
	return nil
}

func postmasterOf(ctx context.Context, conn *pgx.Conn) (int, error) {
	var dir string
	if err := conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("the server's postmaster.pid (it must run on this machine): %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// treeCPUSeconds is the CPU time of a postmaster and all its processes:
// its own utime+stime, its reaped children's (cutime+cstime, which the
// kernel adds when a backend exits), and every live child's utime+stime.
func treeCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	own, err := parseProcStatCPU(string(b))
	if err != nil {
		return 0, err
	}
	reaped, err := parseProcStatChildren(string(b))
	if err != nil {
		return 0, err
	}
	total := own + reaped
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sb, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		s := string(sb)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		if t, err := parseProcStatCPU(s); err == nil {
			total += t
		}
	}
	return float64(total) / clockTicks(), nil
}

// parseProcStatChildren returns cutime+cstime (fields 16 and 17).
func parseProcStatChildren(line string) (uint64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %.80q", line)
	}
	f := strings.Fields(line[i+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("%d fields after the command name", len(f))
	}
	cu, err := strconv.ParseUint(f[16-3], 10, 64)
	if err != nil {
		return 0, err
	}
	cs, err := strconv.ParseUint(f[17-3], 10, 64)
	if err != nil {
		return 0, err
	}
	return cu + cs, nil
}

// pgCPU samples every node's CPU seconds.
func pgCPU(nodes []pgNode) (map[string]float64, error) {
	out := make(map[string]float64, len(nodes))
	for _, n := range nodes {
		v, err := treeCPUSeconds(n.Pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		out[n.Name] = v
	}
	return out, nil
}
