package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one bench run measured; it is written as a text table,
// Markdown, JSON (this struct) and an SVG chart.
type Report struct {
	Info      RunInfo        `json:"info"`
	Engines   []EngineInfo   `json:"engines"`
	Scenarios []ScenarioInfo `json:"scenarios"`
	Results   []Result       `json:"results"`
	Targets   []TargetCheck  `json:"targets"`
}

// RunInfo describes the machine, versions and command of a run.
type RunInfo struct {
	RunID      string            `json:"run_id"`
	Started    time.Time         `json:"started"`
	Finished   time.Time         `json:"finished"`
	Host       string            `json:"host"`
	CPU        string            `json:"cpu"`
	CPUs       int               `json:"cpus"`
	GOMAXPROCS int               `json:"gomaxprocs"`
	MemTotal   uint64            `json:"mem_total_bytes"`
	Kernel     string            `json:"kernel"`
	GoVersion  string            `json:"go_version"`
	OSArch     string            `json:"os_arch"`
	PostgreSQL map[string]string `json:"postgresql,omitempty"`
	Redis      string            `json:"redis_version,omitempty"`
	Database   string            `json:"database,omitempty"`
	SQLiteDir  string            `json:"sqlite_dir,omitempty"`
	SQLiteFS   string            `json:"sqlite_fs,omitempty"`
	MySQL      string            `json:"mysql,omitempty"` // server and durability settings (-mysql engines)
	Command    string            `json:"command"`
	LoadAvg    float64           `json:"load_avg_1m_at_start"`
	Duration   float64           `json:"duration_seconds"`
	Warmup     float64           `json:"warmup_seconds"`
	Messages   int64             `json:"messages,omitempty"`
	Pool       int               `json:"pool"`
	Repeat     int               `json:"repeat"`
	BodySize   int               `json:"body_bytes"`

	checkpointWarned bool
}

// EngineInfo names an engine in the report.
type EngineInfo struct {
	Key   string `json:"key"`
	Name  string `json:"name"`
	About string `json:"about"`
}

// ScenarioInfo describes a scenario in the report.
type ScenarioInfo struct {
	Name    string  `json:"name"`
	Senders int     `json:"senders"`
	Convs   int     `json:"conversations"`
	Skew    float64 `json:"skew,omitempty"`
	About   string  `json:"about"`
}

// TargetCheck is one target of the issue, checked against the results.
type TargetCheck struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Status: "met", "not met", or "not measured".
	Status string `json:"status"`
}

func collectRunInfo(cfg Config) RunInfo {
	host, _ := os.Hostname()
	info := RunInfo{
		Started: time.Now().UTC(), Host: host, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), OSArch: runtime.GOOS + "/" + runtime.GOARCH,
		Command:  "sequencer-bench " + shellJoin(cfg.Args),
		LoadAvg:  loadAvg1(),
		Duration: cfg.Duration.Seconds(), Warmup: cfg.Warmup.Seconds(), Messages: cfg.Messages,
		Pool: cfg.Pool, Repeat: cfg.Repeat, BodySize: cfg.BodySize,
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				info.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 {
					kb, _ := strconv.ParseUint(f[0], 10, 64)
					info.MemTotal = kb * 1024
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		info.Kernel = strings.TrimSpace(string(b))
	}
	return info
}

func engineInfos(specs []EngineSpec) []EngineInfo {
	out := make([]EngineInfo, len(specs))
	for i, s := range specs {
		out[i] = EngineInfo{Key: s.Key, Name: s.Name, About: s.About}
	}
	return out
}

func scenarioInfos(scs []Scenario) []ScenarioInfo {
	out := make([]ScenarioInfo, len(scs))
	for i, s := range scs {
		out[i] = ScenarioInfo{Name: s.Name, Senders: s.Senders, Convs: s.Convs, Skew: s.Skew, About: s.Describe()}
	}
	return out
}

// find returns the result of engine on scenario, if measured.
func find(results []Result, engine, scenario string) (Result, bool) {
	for _, r := range results {
		if r.Engine == engine && r.Scenario == scenario && r.Skipped == "" {
			return r, true
		}
	}
	return Result{}, false
}

// status is a target's verdict.
func status(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// checkTargets checks the targets (2 cores, PostgreSQL local) against
// what was measured.
func checkTargets(results []Result) []TargetCheck {
	var out []TargetCheck
	a, okA := find(results, "a", "many")
	b, okB := find(results, "b", "many")
	d, okD := find(results, "d", "many")
	t := TargetCheck{Target: "many: (a) >= 10x (b)", Status: "not measured"}
	if okA && okB && b.Throughput > 0 {
		x := a.Throughput / b.Throughput
		t.Measured = fmt.Sprintf("%.1fx (%s vs %s msg/s)", x, fmtInt(int64(a.Throughput)), fmtInt(int64(b.Throughput)))
		t.Status = status(x >= 10)
	}
	out = append(out, t)
	t = TargetCheck{Target: "many: (a) >= 60% of (d)", Status: "not measured"}
	if okA && okD && d.Throughput > 0 {
		x := a.Throughput / d.Throughput
		t.Measured = fmt.Sprintf("%.0f%% (%s vs %s msg/s)", 100*x, fmtInt(int64(a.Throughput)), fmtInt(int64(d.Throughput)))
		t.Status = status(x >= 0.6)
	}
	out = append(out, t)
	t = TargetCheck{Target: "hot: (a) >= 40,000 msg/s", Status: "not measured"}
	if h, ok := find(results, "a", "hot"); ok {
		t.Measured = fmtInt(int64(h.Throughput)) + " msg/s"
		t.Status = status(h.Throughput >= 40000)
	}
	out = append(out, t)
	t = TargetCheck{Target: "light: (a) p99 <= 10 ms", Status: "not measured"}
	if l, ok := find(results, "a", "light"); ok && l.Latency.Count > 0 {
		t.Measured = fmt.Sprintf("p99 %s ms", fmtMs(l.Latency.P99))
		t.Status = status(l.Latency.P99 <= 10)
	}
	out = append(out, t)
	t = TargetCheck{Target: "memory: (a) <= 2 KiB per live conversation actor", Status: "not measured"}
	if m, ok := find(results, "a", "memory"); ok && m.Memory != nil && m.Memory.LiveAtEnd > 0 {
		t.Measured = fmt.Sprintf("%s bytes/actor (%s live)", fmtInt(int64(m.Memory.BytesPerActor)), fmtInt(int64(m.Memory.LiveAtEnd)))
		t.Status = status(m.Memory.BytesPerActor <= 2048)
	}
	out = append(out, t)
	out = append(out, networkTargets(results)...)
	return append(out, storeTargets(results)...)
}

// storeTargets are round 3's targets: Citus against single PostgreSQL
// (issue 20) and the group commit on MySQL against the seed's Redis INCR +
// INSERT on MySQL (issue 22), each from engines of the same run.
func storeTargets(results []Result) []TargetCheck {
	var out []TargetCheck
	ratio := func(target, sc, num, den string, min float64, pct bool) {
		t := TargetCheck{Target: target, Status: "not measured"}
		n, ok1 := find(results, num, sc)
		d, ok2 := find(results, den, sc)
		if ok1 && ok2 && d.Throughput > 0 {
			x := n.Throughput / d.Throughput
			if pct {
				t.Measured = fmt.Sprintf("%.0f%% (%s vs %s msg/s)", 100*x, fmtInt(int64(n.Throughput)), fmtInt(int64(d.Throughput)))
			} else {
				t.Measured = fmt.Sprintf("%.1fx (%s vs %s msg/s)", x, fmtInt(int64(n.Throughput)), fmtInt(int64(d.Throughput)))
			}
			t.Status = status(x >= min)
		}
		out = append(out, t)
	}
	ratio("many: (a-citus) >= 60% of (a)", "many", "a-citus", "a", 0.6, true)
	t := TargetCheck{Target: "many: (a-citus) PostgreSQL CPU/msg <= 1.8x (a)'s, coordinator <= 5% of it", Status: "not measured"}
	if c, ok := find(results, "a-citus", "many"); ok && c.PGCPUUsPerMsg > 0 {
		if a, ok := find(results, "a", "many"); ok && a.PGCPUUsPerMsg > 0 {
			x, coord := c.PGCPUUsPerMsg/a.PGCPUUsPerMsg, c.PGCPUUsPerMsgBy["coordinator"]/c.PGCPUUsPerMsg
			t.Measured = fmt.Sprintf("%.2fx, coordinator %.1f%%", x, 100*coord)
			t.Status = status(x <= 1.8 && coord <= 0.05)
		}
	}
	out = append(out, t)
	ratio("hot: (a-citus) >= 80% of (a)", "hot", "a-citus", "a", 0.8, true)
	ratio("many: (a-mysql) >= 3x (b-mysql)", "many", "a-mysql", "b-mysql", 3, false)
	return out
}

// networkTargets are issue 8's targets: the network API and the embedded
// store against the engine in process.
func networkTargets(results []Result) []TargetCheck {
	var out []TargetCheck
	for _, sc := range []string{"many", "hot"} {
		t := TargetCheck{Target: sc + ": (e-batch) >= 80% of (a)", Status: "not measured"}
		eb, ok1 := find(results, "e-batch", sc)
		a, ok2 := find(results, "a", sc)
		if ok1 && ok2 && a.Throughput > 0 {
			x := eb.Throughput / a.Throughput
			t.Measured = fmt.Sprintf("%.0f%% (%s vs %s msg/s)", 100*x, fmtInt(int64(eb.Throughput)), fmtInt(int64(a.Throughput)))
			t.Status = status(x >= 0.8)
		}
		out = append(out, t)
	}
	for _, e := range []string{"e-batch", "e"} {
		t := TargetCheck{Target: "light: (" + e + ") p99 <= 10 ms", Status: "not measured"}
		if l, ok := find(results, e, "light"); ok && l.Latency.Count > 0 {
			t.Measured = fmt.Sprintf("p99 %s ms", fmtMs(l.Latency.P99))
			t.Status = status(l.Latency.P99 <= 10)
		}
		out = append(out, t)
	}
	t := TargetCheck{Target: "many: (e-json) server CPU <= 40 µs/msg", Status: "not measured"}
	if j, ok := find(results, "e-json", "many"); ok && j.CPUScope != "" && j.CPUScope != cpuScopeBench {
		t.Measured = fmt.Sprintf("%.1f µs/msg", j.CPUUsPerMsg)
		t.Status = status(j.CPUUsPerMsg <= 40)
	}
	out = append(out, t)
	for _, c := range []struct {
		engine string
		min    float64
	}{{"a-sqlite", 25000}, {"e-batch-sqlite", 15000}} {
		t := TargetCheck{Target: fmt.Sprintf("many: (%s) >= %s msg/s", c.engine, fmtInt(int64(c.min))), Status: "not measured"}
		if r, ok := find(results, c.engine, "many"); ok {
			t.Measured = fmtInt(int64(r.Throughput)) + " msg/s"
			t.Status = status(r.Throughput >= c.min)
		}
		out = append(out, t)
	}
	return out
}

// summaryLine is the one line printed after each run.
func summaryLine(r Result) string {
	if r.Skipped != "" {
		return fmt.Sprintf("%-14s %-7s skipped: %s", r.Engine, r.Scenario, r.Skipped)
	}
	s := fmt.Sprintf("%-14s %-7s %10s msg/s  p50 %s  p99 %s  p99.9 %s ms  errors %s",
		r.Engine, r.Scenario, fmtInt(int64(r.Throughput)), fmtMs(r.Latency.P50), fmtMs(r.Latency.P99), fmtMs(r.Latency.P999), fmtInt(r.Errors))
	if r.MeanBatch > 0 {
		s += fmt.Sprintf("  batch %.1f", r.MeanBatch)
	}
	if r.MeanCommitMs > 0 {
		s += fmt.Sprintf("  commit %s ms", fmtMs(r.MeanCommitMs))
	}
	if r.CPUScope != "" {
		s += "  CPU " + fmtCPU(r) + " us/msg"
	}
	if m := r.Memory; m != nil {
		s += fmt.Sprintf("  | %s B/actor, peak live %s, peak RSS %s, live after %.0fs idle %s",
			fmtInt(int64(m.BytesPerActor)), fmtInt(int64(m.PeakLive)), fmtBytes(m.PeakRSS), m.IdleSeconds, fmtInt(int64(m.LiveAfterIdle)))
	}
	if r.ErrorSample != "" {
		s += "\n    first error: " + r.ErrorSample
	}
	return s
}

// writeTextTable prints the final table.
func writeTextTable(w io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tengine\tsenders\tconvs\tmsg/s\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\terrors\tmean batch\tcommit ms\tserver CPU us/msg\t")
	for _, r := range rep.Results {
		name := r.Engine + " " + r.EngineName + interruptedMark(r)
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\tskipped\t\t\t\t\t\t\t\t\t\n", r.Scenario, name, r.Senders, fmtInt(int64(r.Convs)))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Scenario, name, r.Senders, fmtInt(int64(r.Convs)),
			fmtInt(int64(r.Throughput)), fmtMs(r.Latency.P50), fmtMs(r.Latency.P90), fmtMs(r.Latency.P99), fmtMs(r.Latency.P999),
			fmtInt(r.Errors), fmtBatch(r.MeanBatch), fmtCommitMs(r.MeanCommitMs), fmtCPU(r))
	}
	tw.Flush()
	fmt.Fprintln(w, "server CPU us/msg: the server process's CPU per stored message over the measured window; * = in-process engine: the whole bench process, senders included.")
	if mem := memoryResults(rep.Results); len(mem) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "memory\tconversations\tpeak live\tbytes/live actor\tpeak RSS\tlive after idle\theap after idle\t")
		for _, r := range mem {
			m := r.Memory
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s (%.0fs)\t%s\t\n", r.Engine+" "+r.EngineName, fmtInt(int64(m.Conversations)),
				fmtInt(int64(m.PeakLive)), fmtInt(int64(m.BytesPerActor)), fmtBytes(m.PeakRSS), fmtInt(int64(m.LiveAfterIdle)), m.IdleSeconds, fmtBytes(m.HeapAfterIdle))
		}
		tw.Flush()
	}
	if len(rep.Targets) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "target\tmeasured\tstatus")
		for _, t := range rep.Targets {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Target, orDash(t.Measured), t.Status)
		}
		tw.Flush()
	}
}

func memoryResults(results []Result) []Result {
	var out []Result
	for _, r := range results {
		if r.Memory != nil {
			out = append(out, r)
		}
	}
	return out
}

// reportPaths returns the Markdown, JSON and SVG paths for --report FILE.
func reportPaths(file string) (md, js, svg string) {
	base := strings.TrimSuffix(file, ".md")
	if base == file {
		md = file
	} else {
		md = base + ".md"
	}
	return md, base + ".json", base + ".svg"
}

// WriteFiles writes the Markdown report to file and the JSON and SVG chart
// beside it; it returns the paths written.
func (rep *Report) WriteFiles(file string) ([]string, error) {
	md, js, svg := reportPaths(file)
	if dir := filepath.Dir(md); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("report directory: %w", err)
		}
	}
	jb, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	var mb strings.Builder
	rep.WriteMarkdown(&mb, filepath.Base(svg))
	var sb strings.Builder
	rep.WriteSVG(&sb)
	for _, f := range []struct {
		path string
		data []byte
	}{{md, []byte(mb.String())}, {js, append(jb, '\n')}, {svg, []byte(sb.String())}} {
		if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
			return nil, fmt.Errorf("write report: %w", err)
		}
	}
	return []string{md, js, svg}, nil
}

// WriteMarkdown writes the report as Markdown; chart is the SVG's path
// relative to the Markdown file ("" for none).
func (rep *Report) WriteMarkdown(w io.Writer, chart string) {
	in := rep.Info
	fmt.Fprintf(w, "# sequencer bench, run %s\n\n", in.RunID)
	fmt.Fprintf(w, "Started %s, finished %s.\n\n", in.Started.Format(time.RFC3339), in.Finished.Format(time.RFC3339))
	fmt.Fprintf(w, "Command: `%s`\n\n", in.Command)
	fmt.Fprintf(w, "## Machine and versions\n\n| | |\n|---|---|\n")
	fmt.Fprintf(w, "| CPU | %s, %d logical CPUs (GOMAXPROCS %d) |\n", orDash(in.CPU), in.CPUs, in.GOMAXPROCS)
	fmt.Fprintf(w, "| memory | %s |\n", fmtBytes(in.MemTotal))
	fmt.Fprintf(w, "| OS | %s, kernel %s |\n", in.OSArch, orDash(in.Kernel))
	fmt.Fprintf(w, "| Go | %s |\n", in.GoVersion)
	if pg := in.PostgreSQL; pg != nil {
		fmt.Fprintf(w, "| PostgreSQL | %s (synchronous_commit=%s, fsync=%s, wal_sync_method=%s, shared_buffers=%s, max_connections=%s) |\n",
			pg["server_version"], pg["synchronous_commit"], pg["fsync"], pg["wal_sync_method"], pg["shared_buffers"], pg["max_connections"])
	}
	if in.Redis != "" {
		fmt.Fprintf(w, "| Redis | %s |\n", in.Redis)
	}
	if in.SQLiteDir != "" {
		fmt.Fprintf(w, "| SQLite files (-sqlite engines) | %s (%s) |\n", in.SQLiteDir, orDash(in.SQLiteFS))
	}
	if in.MySQL != "" {
		fmt.Fprintf(w, "| MySQL (-mysql engines) | %s |\n", in.MySQL)
	}
	fmt.Fprintf(w, "| load average (1 min) at start | %.2f |\n", in.LoadAvg)
	mode := fmt.Sprintf("%gs measured after %gs warmup", in.Duration, in.Warmup)
	if in.Repeat > 1 {
		mode += fmt.Sprintf(", %d runs interleaved, each round starting one engine later (median shown)", in.Repeat)
	}
	if in.Messages > 0 {
		mode = fmt.Sprintf("%s messages per run", fmtInt(in.Messages))
	}
	fmt.Fprintf(w, "| each run | %s; %d database connections for b and c and their -mysql variants (a and e: the server's store defaults); %d-byte bodies |\n\n", mode, in.Pool, in.BodySize)
	fmt.Fprintln(w, "Latency is measured by each sender around one Send, from call to durable answer. *mean batch* is messages per store commit and *commit ms* the mean time of one commit (as the engine times it), both over the measured window; *server CPU µs/msg* is the user+system CPU time of the process that sequences over the measured window (/proc/PID/stat) divided by the messages stored in it: for the e engines the server process alone, for the in-process engines a and a-sqlite (marked *) the whole bench process, its senders included; PostgreSQL's own CPU is in none of them; *of (d)* is throughput relative to the COPY ceiling in the same scenario; *load* is the machine's 1-minute load average when the run started (the bench's own processes keep it at 2-6 on two cores; clearly higher values mean other work on the machine).")
	fmt.Fprintln(w)

	fmt.Fprintf(w, "## Engines\n\n| key | engine | per message |\n|---|---|---|\n")
	for _, e := range rep.Engines {
		fmt.Fprintf(w, "| %s | %s | %s |\n", e.Key, e.Name, e.About)
	}
	fmt.Fprintln(w)

	for _, sc := range rep.Scenarios {
		var rows []Result
		for _, r := range rep.Results {
			if r.Scenario == sc.Name {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "## %s: %s\n\n", sc.Name, sc.About)
		if sc.Name == "memory" {
			rep.writeMemoryMarkdown(w, rows)
			continue
		}
		d, hasD := find(rep.Results, "d", sc.Name)
		fmt.Fprintf(w, "| engine | msg/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors | mean batch | commit ms | server CPU µs/msg | of (d) | load |\n")
		fmt.Fprintf(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rows {
			if r.Skipped != "" {
				fmt.Fprintf(w, "| %s %s | skipped: %s |||||||||||\n", r.Engine, r.EngineName, r.Skipped)
				continue
			}
			ofD := "-"
			if hasD && d.Throughput > 0 {
				ofD = fmt.Sprintf("%.0f%%", 100*r.Throughput/d.Throughput)
			}
			fmt.Fprintf(w, "| %s %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f |\n", r.Engine, r.EngineName+interruptedMark(r),
				fmtThroughputRuns(r), fmtMs(r.Latency.P50), fmtMs(r.Latency.P90), fmtMs(r.Latency.P99),
				fmtMs(r.Latency.P999), fmtMs(r.Latency.Max), fmtErrors(r), fmtBatch(r.MeanBatch), fmtCommitMs(r.MeanCommitMs), fmtCPU(r), ofD, r.LoadAvg)
		}
		fmt.Fprintln(w)
	}

	rep.writePGCPUMarkdown(w)

	fmt.Fprintf(w, "## Targets (issues, 2 cores, databases local)\n\n| target | measured | status |\n|---|---|---|\n")
	for _, t := range rep.Targets {
		fmt.Fprintf(w, "| %s | %s | %s |\n", t.Target, orDash(t.Measured), t.Status)
	}
	fmt.Fprintln(w)
	if chart != "" {
		fmt.Fprintf(w, "## Chart\n\n![throughput and p99 per engine and scenario](%s)\n", chart)
	}
}

// writePGCPUMarkdown writes the PostgreSQL servers' CPU per message of
// every engine that measured it, by server, and each -citus engine's
// figures relative to its single-PostgreSQL counterpart in the same run
// (a-citus to a, e-batch-citus to e-batch).
func (rep *Report) writePGCPUMarkdown(w io.Writer) {
	var rows []Result
	for _, r := range rep.Results {
		if r.Skipped == "" && r.PGCPUUsPerMsg > 0 {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## PostgreSQL CPU per message\n\n")
	fmt.Fprintln(w, "The CPU time of every process of each PostgreSQL server (postmaster, backends, background processes, and the backends that exited during the run) over the measured window, divided by the messages stored in it (with --repeat: the median-throughput run's, every run's range in brackets); the servers run on this machine, and any other session's work on them counts too. For a -citus engine, *vs single PostgreSQL* compares it with the engine of the same name without -citus in the same run, and *coordinator share* is the coordinator's part of its PostgreSQL CPU.")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| scenario | engine | msg/s | vs single PostgreSQL | msgs/commit | PostgreSQL CPU µs/msg | by server | vs single PostgreSQL | coordinator share |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|---|--:|--:|\n")
	for _, r := range rows {
		tput, cpu, coord := "-", "-", "-"
		if key, ok := strings.CutSuffix(r.Engine, "-citus"); ok {
			if b, ok := find(rep.Results, key, r.Scenario); ok && b.Skipped == "" && b.Throughput > 0 && b.PGCPUUsPerMsg > 0 {
				tput = fmt.Sprintf("%.0f%%", 100*r.Throughput/b.Throughput)
				cpu = fmt.Sprintf("%.2fx", r.PGCPUUsPerMsg/b.PGCPUUsPerMsg)
			}
			if c, ok := r.PGCPUUsPerMsgBy["coordinator"]; ok {
				coord = fmt.Sprintf("%.1f%%", 100*c/r.PGCPUUsPerMsg)
			}
		}
		pgcpu := fmt.Sprintf("%.1f", r.PGCPUUsPerMsg)
		if len(r.RunsPGCPU) > 1 {
			pgcpu += fmt.Sprintf(" (%.1f-%.1f)", slices.Min(r.RunsPGCPU), slices.Max(r.RunsPGCPU))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Scenario, r.Engine, fmtInt(int64(r.Throughput)), tput,
			fmtBatch(r.MeanBatch), pgcpu, fmtPGCPUBy(r.PGCPUUsPerMsgBy), cpu, coord)
	}
	fmt.Fprintln(w)
}

// fmtPGCPUBy lists the CPU per message by server, the coordinator first
// ("-" for a single server).
func fmtPGCPUBy(by map[string]float64) string {
	if len(by) < 2 {
		return "-"
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if (a == "coordinator") != (b == "coordinator") {
			if a == "coordinator" {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.1f", n, by[n])
	}
	return strings.Join(parts, ", ")
}

func (rep *Report) writeMemoryMarkdown(w io.Writer, rows []Result) {
	fmt.Fprintf(w, "| engine | conversations | msg/s | peak live actors | heap growth | bytes per live actor | peak RSS | live after idle | heap after idle |\n")
	fmt.Fprintf(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	var notes []string
	for _, r := range rows {
		if r.Skipped != "" || r.Memory == nil {
			fmt.Fprintf(w, "| %s %s | skipped: %s ||||||||\n", r.Engine, r.EngineName, orDash(r.Skipped))
			continue
		}
		m := r.Memory
		growth := uint64(0)
		if m.HeapAtEnd > m.HeapBefore {
			growth = m.HeapAtEnd - m.HeapBefore
		}
		fmt.Fprintf(w, "| %s %s | %s | %s | %s | %s | %s | %s | %s after %.0f s | %s |\n", r.Engine, r.EngineName,
			fmtInt(int64(m.Conversations)), fmtInt(int64(r.Throughput)), fmtInt(int64(m.PeakLive)), fmtBytes(growth),
			fmtInt(int64(m.BytesPerActor)), fmtBytes(m.PeakRSS), fmtInt(int64(m.LiveAfterIdle)), m.IdleSeconds, fmtBytes(m.HeapAfterIdle))
		if m.Note != "" {
			notes = append(notes, r.Engine+": "+m.Note)
		}
		if m.StoppedAtRSS {
			notes = append(notes, fmt.Sprintf("%s: stopped early at the RSS limit after %s of %s conversations", r.Engine, fmtInt(r.Messages), fmtInt(int64(m.Conversations))))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Bytes per live actor = (Go heap after the last send - Go heap before the first, both after a forced GC) / (live actors after the last send - live actors before the first). Peak RSS is the whole process the engine runs in: the bench process for in-process engines (VmHWM, reset at the scenario's start, so it includes the senders), the server for a remote engine (sampled every 200 ms from its /metrics). Live actors after idle are counted once passivation had time to run.")
	for _, n := range notes {
		fmt.Fprintln(w, "\n"+n)
	}
	fmt.Fprintln(w)
}

// fmtInt formats n with thousands separators: 1234567 -> "1,234,567".
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtMs formats milliseconds with about three significant digits.
func fmtMs(ms float64) string {
	switch {
	case ms == 0:
		return "0"
	case ms < 1:
		return strconv.FormatFloat(ms, 'f', 3, 64)
	case ms < 10:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	case ms < 100:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	}
	return fmtInt(int64(ms + 0.5))
}

// fmtBytes formats a byte count in binary units.
func fmtBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func fmtBatch(b float64) string {
	if b <= 0 {
		return "-"
	}
	return strconv.FormatFloat(b, 'f', 1, 64)
}

// fmtThroughputRuns is the throughput, followed by the range over all runs
// when there were several: "45,936 (41,002-52,163, 3 runs)".
func fmtThroughputRuns(r Result) string {
	s := fmtInt(int64(r.Throughput))
	if len(r.RunsThroughput) > 1 {
		lo, hi := slices.Min(r.RunsThroughput), slices.Max(r.RunsThroughput)
		s += fmt.Sprintf(" (%s-%s, %d runs)", fmtInt(int64(lo)), fmtInt(int64(hi)), len(r.RunsThroughput))
	}
	return s
}

func interruptedMark(r Result) string {
	if r.Interrupted {
		return " (interrupted)"
	}
	return ""
}

// fmtCPU is the CPU µs per message, marked * when it is the bench process's
// (an in-process engine, senders included) rather than the server's.
func fmtCPU(r Result) string {
	if r.CPUScope == "" {
		return "-"
	}
	s := strconv.FormatFloat(r.CPUUsPerMsg, 'f', 1, 64)
	if r.CPUScope == cpuScopeBench {
		s += "*"
	}
	return s
}

func fmtCommitMs(ms float64) string {
	if ms <= 0 {
		return "-"
	}
	return fmtMs(ms)
}

func fmtErrors(r Result) string {
	if r.Errors == 0 {
		return "0"
	}
	var parts []string
	for code, n := range r.ErrorCodes {
		parts = append(parts, code+" "+fmtInt(n))
	}
	slices.Sort(parts)
	return fmtInt(r.Errors) + " (" + strings.Join(parts, ", ") + ")"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shellJoin quotes args for a copy-pasteable command line.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
