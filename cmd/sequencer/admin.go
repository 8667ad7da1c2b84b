package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sequencer-im/sequencer/admin"
	"github.com/sequencer-im/sequencer/server"
)

// adminUsage is the admin command's help (its defaults are serve's).
var adminUsage = fmt.Sprintf(`sequencer admin COMMAND [args] [flags]: operator commands on the store's tables

Commands:
  members                 member rows: state (live, leaving, expired), lease left, leases held
  partitions              every partition: lease owner, epoch, ring owner, moving
  head CONV               a conversation's head, next seq and first stored seq (on Citus: its shard and worker)
  route CONV              partition and owner of CONV (ring over the current membership), and its lease
  shards                  Citus: every shard (hash range, worker, bytes, conversations, messages) and
                          every worker (shards, bytes, reachable from here)
  drain NODE [--wait D]   graceful leave of NODE: it leaves the ring, hands off, exits 0
  forget NODE [--force]   remove a dead member's row now (refused while its lease is live)
  migrate status          applied vs available schema migrations
  feed                    the firehose's backlog per partition, from the store's outbox (docs/FEED.md)
  trim --before TIME | --older-than 90d
                          one retention pass: delete older messages, heads kept
  backup --to FILE        copy the embedded store online (VACUUM INTO) into a new 0600 file; PostgreSQL: pg_dump

Flags of every command (--store and --partitions also from the environment, as for serve):
  --store       [SEQUENCER_STORE]       the store, as for serve (postgres://..., mysql://... or a path / sqlite:PATH)
  --partitions  [SEQUENCER_PARTITIONS]  the nodes' --partitions (default %d)
  --json                                machine-readable output

Cluster commands (members, partitions, route, drain, forget) need PostgreSQL or MySQL;
shards needs a Citus store.
See docs/OPERATIONS.md.
`, server.DefaultConfig().Cluster.Ring.Partitions)

// adminCmd runs `sequencer admin ...`.
func adminCmd(args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, adminUsage)
		return errors.New("a command is needed")
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, adminUsage)
		return flag.ErrHelp
	}
	name, args := args[0], args[1:]
	if name == "migrate" {
		if len(args) == 0 || args[0] != "status" {
			return errors.New(`migrate: only "migrate status" (to apply migrations: sequencer migrate)`)
		}
		name, args = "migrate status", args[1:]
	}
	fs := flag.NewFlagSet("admin "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := fs.String("store", "./data", "postgres://... DSN, mysql://... URL, or a file path / sqlite:PATH for the embedded store")
	partitions := fs.Int("partitions", server.DefaultConfig().Cluster.Ring.Partitions, "the ring's partition count: the nodes' --partitions")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	var force *bool
	var wait *time.Duration
	var before, to *string
	var olderThan time.Duration
	npos := 0
	switch name {
	case "members", "partitions", "shards", "migrate status", "feed":
	case "head", "route":
		npos = 1
	case "forget":
		npos = 1
		force = fs.Bool("force", false, "forget the member even though its lease is live (only when its process is gone)")
	case "drain":
		npos = 1
		wait = fs.Duration("wait", 0, "wait up to this long for the node to finish leaving (0: return once requested)")
	case "trim":
		before = fs.String("before", "", "delete messages with server_at before this RFC 3339 time")
		fs.Var(admin.Duration{D: &olderThan}, "older-than", "delete messages older than this (90d, 36h)")
	case "backup":
		to = fs.String("to", "", "the backup file to create (must not exist)")
	default:
		return fmt.Errorf("unknown command %q\n\n%s", name, adminUsage)
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "sequencer admin %s [flags]  (sequencer admin --help lists the commands)\n\nFlags (--store and --partitions also from SEQUENCER_STORE, SEQUENCER_PARTITIONS):\n", name)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args, getenv)
	if err != nil {
		return err
	}
	if len(pos) != npos {
		return fmt.Errorf("%s takes %d argument(s), got %d: %q", name, npos, len(pos), pos)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	a, err := admin.Open(octx, *store, admin.Options{Partitions: *partitions})
	cancel()
	if err != nil {
		return err
	}
	defer a.Close()

	var out admin.Tabler
	switch name {
	case "members":
		out, err = a.Members(ctx)
	case "partitions":
		out, err = a.Partitions(ctx)
	case "shards":
		out, err = a.Shards(ctx)
	case "feed":
		out, err = a.Feed(ctx)
	case "head":
		out, err = a.Head(ctx, pos[0])
	case "route":
		out, err = a.Route(ctx, pos[0])
	case "forget":
		out, err = a.Forget(ctx, pos[0], *force)
	case "drain":
		out, err = a.Drain(ctx, pos[0], *wait)
	case "migrate status":
		out, err = a.MigrateStatus(ctx)
	case "trim":
		var cut time.Time
		switch {
		case *before != "" && olderThan != 0:
			return errors.New("trim: give --before or --older-than, not both")
		case *before != "":
			if cut, err = time.Parse(time.RFC3339Nano, *before); err != nil {
				return fmt.Errorf("trim --before: %w", err)
			}
		case olderThan > 0:
			cut = time.Now().Add(-olderThan)
		default:
			return errors.New("trim: --before TIME or --older-than DURATION needed")
		}
		out, err = a.Trim(ctx, cut)
	case "backup":
		out, err = a.Backup(ctx, *to)
	}
	if err != nil {
		return err
	}
	if err := admin.Render(stdout, out, *asJSON); err != nil {
		return err
	}
	if d, ok := out.(admin.Drained); ok && d.Rejoined != "" {
		return fmt.Errorf("drain %s: a new incarnation %s joined: it is not drained", d.NodeID, d.Rejoined)
	}
	return nil
}

// parseInterleaved parses flags that may come before or after positional
// arguments (`admin head g:42 --store ...`), then applies SEQUENCER_STORE and
// SEQUENCER_PARTITIONS when those flags were not given (the environment of
// the nodes; no other admin flag, e.g. --force, is ever read from it).
func parseInterleaved(fs *flag.FlagSet, args []string, getenv func(string) string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if strings.HasPrefix(args[0], "-") && args[0] != "-" { // after "--"
			pos = append(pos, args...)
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range []string{"store", "partitions"} {
		if v := getenv(envName(name)); v != "" && !given[name] {
			if err := fs.Set(name, v); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", envName(name), v, err)
			}
		}
	}
	return pos, nil
}
