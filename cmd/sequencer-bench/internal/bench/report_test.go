package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLatencyQuantilesFromManySenders(t *testing.T) {
	l := NewLatency()
	// 1..10,000 µs, spread over 100 senders (every shard).
	for v := 1; v <= 10000; v++ {
		l.Record(v%100, time.Duration(v)*time.Microsecond)
	}
	s := Summarize(l.Snapshot())
	if s.Count != 10000 {
		t.Fatalf("count %d, want 10000", s.Count)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"p50", s.P50, 5}, {"p90", s.P90, 9}, {"p99", s.P99, 9.9}, {"p99.9", s.P999, 9.99}, {"max", s.Max, 10}, {"mean", s.Mean, 5.0005},
	} {
		if math.Abs(c.got-c.want)/c.want > 0.002 { // 3 significant digits
			t.Errorf("%s = %v ms, want %v ms within 0.2%%", c.name, c.got, c.want)
		}
	}
}

func TestLatencyClampsAndEmpty(t *testing.T) {
	if s := Summarize(NewLatency().Snapshot()); s != (LatencySummary{}) {
		t.Errorf("empty histogram summary %+v, want zero", s)
	}
	l := NewLatency()
	l.Record(0, 0)
	l.Record(1, time.Hour)
	s := Summarize(l.Snapshot())
	if s.Count != 2 || s.Max < 119000 || s.Max > 121000 {
		t.Errorf("clamped summary %+v: want 2 values, max about 2 min", s)
	}
}

func TestNumberFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtInt(0), "0"}, {fmtInt(999), "999"}, {fmtInt(1000), "1,000"}, {fmtInt(1234567), "1,234,567"}, {fmtInt(-45120), "-45,120"},
		{fmtMs(0), "0"}, {fmtMs(0.4567), "0.457"}, {fmtMs(3.14159), "3.14"}, {fmtMs(42.42), "42.4"}, {fmtMs(1234.4), "1,234"},
		{fmtBytes(512), "512 B"}, {fmtBytes(2048), "2.0 KiB"}, {fmtBytes(3 << 30), "3.0 GiB"},
		{fmtShort(950), "950"}, {fmtShort(45120), "45.1k"}, {fmtShort(2.5e6), "2.5M"},
		{fmtBatch(0), "-"}, {fmtBatch(105.14), "105.1"},
		{shellJoin([]string{"--engines", "a,b", "--pg", "postgres://u@h/db?x=1&y=2"}), "--engines a,b --pg 'postgres://u@h/db?x=1&y=2'"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if got := niceCeil(45120); got != 50000 {
		t.Errorf("niceCeil(45120) = %v, want 50000", got)
	}
	if got := niceCeil(0); got != 1 {
		t.Errorf("niceCeil(0) = %v, want 1", got)
	}
}

func TestReportPaths(t *testing.T) {
	for _, c := range []struct{ in, md, js, svg string }{
		{"out/bench.md", "out/bench.md", "out/bench.json", "out/bench.svg"},
		{"results", "results", "results.json", "results.svg"},
	} {
		md, js, svg := reportPaths(c.in)
		if md != c.md || js != c.js || svg != c.svg {
			t.Errorf("reportPaths(%q) = %q %q %q", c.in, md, js, svg)
		}
	}
}

// sampleReport is a report as a full run would produce it.
func sampleReport() *Report {
	res := func(engine, name, sc string, tput, p99 float64) Result {
		return Result{Engine: engine, EngineName: name, Scenario: sc, Senders: 1024, Convs: 10000, Seconds: 10,
			Messages: int64(tput * 10), Throughput: tput, MeanBatch: 1, MeanCommitMs: 4.2,
			Latency: LatencySummary{Count: int64(tput * 10), P50: p99 / 3, P90: p99 / 2, P99: p99, P999: p99 * 1.5, Max: p99 * 2}}
	}
	results := []Result{
		res("a", "sequencer, in process", "many", 52000, 40),
		res("b", "Redis INCR + INSERT", "many", 5000, 300),
		res("d", "COPY, no seq (ceiling)", "many", 80000, 30),
		res("a", "sequencer, in process", "hot", 41000, 50),
		res("b", "Redis INCR + INSERT", "hot", 4000, 350),
		res("d", "COPY, no seq (ceiling)", "hot", 79000, 30),
		res("a", "sequencer, in process", "light", 9000, 12.5),
		{Engine: "b", EngineName: "Redis INCR + INSERT", Scenario: "memory", Skipped: "no per-conversation state in memory"},
		{Engine: "a", EngineName: "sequencer, in process", Scenario: "memory", Senders: 1024, Convs: 1000000, Throughput: 40000,
			Memory: &MemoryResult{Conversations: 1000000, PeakLive: 1000000, LiveAtEnd: 1000000, HeapBefore: 10 << 20,
				HeapAtEnd: 10<<20 + 1500*1000000, BytesPerActor: 1500, PeakRSS: 3 << 30, IdleSeconds: 12, HeapAfterIdle: 12 << 20}},
	}
	results[1].Errors, results[1].ErrorCodes = 3, map[string]int64{"unavailable": 2, "error": 1}
	results[0].CPUUsPerMsg, results[0].CPUScope = 12.5, cpuScopeBench
	jsonRow := res("e-json", "sequencer serve, JSON HTTP/1.1", "many", 9000, 90)
	jsonRow.CPUUsPerMsg, jsonRow.CPUScope = 35.04, cpuScopeServer
	batch := res("e-batch", "sequencer serve, SDK batching", "many", 45000, 50)
	batch.CPUUsPerMsg, batch.CPUScope = 20, cpuScopeServer
	results = append(results, jsonRow, batch, res("a-sqlite", "sequencer, in process, SQLite", "many", 24000, 60))
	return &Report{
		Info:    RunInfo{RunID: "cafe0123", Command: "sequencer bench --duration 10s", CPUs: 2, GOMAXPROCS: 2, PostgreSQL: map[string]string{"server_version": "15.20", "synchronous_commit": "on"}},
		Engines: []EngineInfo{{Key: "a", Name: "sequencer, in process"}, {Key: "b", Name: "Redis INCR + INSERT"}, {Key: "d", Name: "COPY, no seq (ceiling)"}},
		Scenarios: []ScenarioInfo{{Name: "many", About: "many conversations"}, {Name: "hot", About: "hot"},
			{Name: "light", About: "light"}, {Name: "memory", About: "memory"}},
		Results: results,
		Targets: checkTargets(results),
	}
}

func TestTargetsAreCheckedAgainstResults(t *testing.T) {
	got := map[string]TargetCheck{}
	for _, c := range sampleReport().Targets {
		got[c.Target] = c
	}
	want := map[string]string{
		"many: (a) >= 10x (b)":                             "met",          // 52,000 vs 5,000
		"many: (a) >= 60% of (d)":                          "met",          // 65%
		"hot: (a) >= 40,000 msg/s":                         "met",          // 41,000
		"light: (a) p99 <= 10 ms":                          "not met",      // 12.5
		"memory: (a) <= 2 KiB per live conversation actor": "met",          // 1,500
		"many: (e-batch) >= 80% of (a)":                    "met",          // 45,000 vs 52,000
		"hot: (e-batch) >= 80% of (a)":                     "not measured", // no e-batch hot
		"light: (e) p99 <= 10 ms":                          "not measured",
		"many: (e-json) server CPU <= 40 µs/msg":           "met",     // 35.0
		"many: (a-sqlite) >= 25,000 msg/s":                 "not met", // 24,000
		"many: (e-batch-sqlite) >= 15,000 msg/s":           "not measured",
	}
	for target, status := range want {
		if got[target].Status != status {
			t.Errorf("%s: %q (%s), want %q", target, got[target].Status, got[target].Measured, status)
		}
	}
	if m := got["many: (a) >= 10x (b)"].Measured; m != "10.4x (52,000 vs 5,000 msg/s)" {
		t.Errorf("measured %q", m)
	}
	if m := got["many: (e-batch) >= 80% of (a)"].Measured; m != "87% (45,000 vs 52,000 msg/s)" {
		t.Errorf("measured %q", m)
	}
	none := checkTargets(nil)
	for _, c := range none {
		if c.Status != "not measured" {
			t.Errorf("%s with no results: %q", c.Target, c.Status)
		}
	}
}

func TestMarkdownHasEveryRow(t *testing.T) {
	var b strings.Builder
	sampleReport().WriteMarkdown(&b, "bench.svg")
	md := b.String()
	for _, want := range []string{
		"# sequencer bench, run cafe0123",
		"Command: `sequencer bench --duration 10s`",
		"| PostgreSQL | 15.20 (synchronous_commit=on",
		"## many: many conversations",
		"| a sequencer, in process | 52,000 | 13.3 | 20.0 | 40.0 | 60.0 | 80.0 | 0 | 1.0 | 4.20 | 12.5* | 65% |",
		"| e-json sequencer serve, JSON HTTP/1.1 | 9,000 | 30.0 | 45.0 | 90.0 | 135 | 180 | 0 | 1.0 | 4.20 | 35.0 | 11% |",
		"| b Redis INCR + INSERT | 5,000 | 100 | 150 | 300 | 450 | 600 | 3 (error 1, unavailable 2) | 1.0 | 4.20 | - | 6% |",
		"server CPU µs/msg",
		"| b Redis INCR + INSERT | 5,000 |",
		"3 (error 1, unavailable 2)",
		"| b Redis INCR + INSERT | skipped: no per-conversation state in memory |",
		"| a sequencer, in process | 1,000,000 | 40,000 | 1,000,000 | 1.4 GiB | 1,500 | 3.0 GiB | 0 after 12 s | 12.0 MiB |",
		"| light: (a) p99 <= 10 ms | p99 12.5 ms | not met |",
		"![throughput and p99 per engine and scenario](bench.svg)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestTextTable(t *testing.T) {
	var b bytes.Buffer
	writeTextTable(&b, sampleReport())
	out := b.String()
	for _, want := range []string{"p99.9 ms", "52,000", "commit ms", "4.20", "skipped", "bytes/live actor", "1,500", "not met", "server CPU us/msg", "12.5*", "35.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestSVGIsWellFormedWithOneBarPerMeasurement(t *testing.T) {
	var b strings.Builder
	sampleReport().WriteSVG(&b)
	dec := xml.NewDecoder(strings.NewReader(b.String()))
	bars := map[string]int{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, b.String())
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			for _, a := range se.Attr {
				if a.Name.Local == "fill" {
					bars[a.Value]++
				}
			}
		}
	}
	// Two panels; many, hot, light: a has 3 runs, b 2, d 2. Plus one legend
	// square per engine.
	for key, n := range map[string]int{"a": 3*2 + 1, "b": 2*2 + 1, "d": 2*2 + 1} {
		if got := bars[engineColors[key]]; got != n {
			t.Errorf("engine %s: %d rects, want %d", key, got, n)
		}
	}
}

func TestParseMetricsSumsSeries(t *testing.T) {
	text := `# HELP sequencer_commit_batch_messages Messages per store transaction.
# TYPE sequencer_commit_batch_messages histogram
sequencer_commit_batch_messages_bucket{le="1"} 3
sequencer_commit_batch_messages_sum 1234
sequencer_commit_batch_messages_count 12
sequencer_sends_total{code="ok"} 10
sequencer_sends_total{code="unavailable"} 2
process_resident_memory_bytes 1.2345e+08
weird{a="}"} 7
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"sequencer_commit_batch_messages_sum": 1234, "sequencer_commit_batch_messages_count": 12,
		"sequencer_sends_total": 12, "process_resident_memory_bytes": 123450000, "weird": 7,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
}

func TestScenarioOverridesAndPicker(t *testing.T) {
	scs, err := parseScenarios("hot,many,skewed", scenarioOverrides{Senders: 7, Duration: time.Second, Warmup: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) != 3 || scs[0].Name != "hot" || scs[0].Senders != 7 || scs[0].Convs != 1 || scs[1].Convs != 10000 || scs[2].Skew != 1.1 {
		t.Fatalf("scenarios %+v", scs)
	}
	if d := scs[1].Describe(); d != "many conversations: 7 senders, 10,000 conversations, picked uniformly" {
		t.Errorf("describe: %q", d)
	}
	if d := scs[0].Describe(); d != "one hot conversation: 7 senders, 1 conversation, every sender on it" {
		t.Errorf("describe: %q", d)
	}
	hot := newConvPicker(scs[0], 1)
	for range 100 {
		if k := hot.next(); k != 0 {
			t.Fatalf("hot picked %d", k)
		}
	}
	count := func(p *convPicker) (zero, distinct int) {
		seen := map[int]bool{}
		for range 20000 {
			k := p.next()
			if k < 0 || k >= 10000 {
				t.Fatalf("picked %d outside 0..9999", k)
			}
			if k == 0 {
				zero++
			}
			seen[k] = true
		}
		return zero, len(seen)
	}
	uz, ud := count(newConvPicker(scs[1], 2))
	zz, zd := count(newConvPicker(scs[2], 3))
	if uz > 20 || ud < 8000 {
		t.Errorf("uniform: conversation 0 picked %d times, %d distinct; want spread", uz, ud)
	}
	if zz < 2000 || zd > ud {
		t.Errorf("zipf: conversation 0 picked %d times, %d distinct; want a hot head", zz, zd)
	}
	if _, err := parseScenarios("many", scenarioOverrides{Skew: 0.5, SkewSet: true}); err == nil {
		t.Error("skew 0.5 accepted")
	}
	ms, _ := parseScenarios("memory", scenarioOverrides{Messages: 5, Warmup: time.Second})
	if ms[0].Warmup != 0 || !ms[0].TouchOnce {
		t.Errorf("messages mode keeps warmup: %+v", ms[0])
	}
}

func TestMedianRunOfRepeats(t *testing.T) {
	run := func(tput, p99 float64) Result {
		return Result{Engine: "a", Scenario: "many", Throughput: tput, Latency: LatencySummary{P99: p99}}
	}
	failed := Result{Engine: "a", Scenario: "many", Skipped: "failed: boom"}
	m := medianRun([]Result{run(30, 9), failed, run(10, 7), run(20, 8)})
	if m.Throughput != 20 || m.Latency.P99 != 8 || m.FailedRuns != 1 {
		t.Errorf("median %+v, want the 20 msg/s run and one failed run", m)
	}
	if m.RunsPGCPU != nil {
		t.Errorf("runs' PostgreSQL CPU %v without any measured", m.RunsPGCPU)
	}
	withPG := []Result{run(30, 9), run(10, 7), run(20, 8)}
	for i := range withPG {
		withPG[i].PGCPUUsPerMsg = float64(i + 1)
	}
	if m := medianRun(withPG); m.PGCPUUsPerMsg != 3 || !slices.Equal(m.RunsPGCPU, []float64{1, 2, 3}) {
		t.Errorf("PostgreSQL CPU %v, runs %v: want the median run's 3 and every run's", m.PGCPUUsPerMsg, m.RunsPGCPU)
	}
	if !slices.Equal(m.RunsThroughput, []float64{30, 10, 20}) || !slices.Equal(m.RunsP99, []float64{9, 7, 8}) {
		t.Errorf("runs %v %v, want every measured run in order", m.RunsThroughput, m.RunsP99)
	}
	if got := fmtThroughputRuns(m); got != "20 (10-30, 3 runs)" {
		t.Errorf("cell %q", got)
	}
	if m := medianRun([]Result{run(10, 1), run(40, 2)}); m.Throughput != 10 {
		t.Errorf("even count: median %v, want the lower middle 10", m.Throughput)
	}
	if m := medianRun([]Result{failed}); m.Skipped == "" {
		t.Errorf("only failures: %+v, want the failure", m)
	}
	if m := medianRun([]Result{run(5, 1)}); m.RunsThroughput != nil || fmtThroughputRuns(m) != "5" {
		t.Errorf("single run carries runs: %+v", m)
	}
}

func TestRenderSavedReport(t *testing.T) {
	dir := t.TempDir()
	rep := sampleReport()
	rep.Scenarios[0].Senders, rep.Scenarios[0].Convs = 1024, 10000
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "saved.json")
	if err := os.WriteFile(src, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := Main(context.Background(), []string{"--render", src, "--report", filepath.Join(dir, "new", "r.md")}, &out, &errb); err != nil {
		t.Fatalf("render: %v\n%s", err, errb.String())
	}
	md, err := os.ReadFile(filepath.Join(dir, "new", "r.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## many: many conversations: 1,024 senders, 10,000 conversations, picked uniformly", "| b Redis INCR + INSERT | 5,000 |", "r.svg"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("rendered markdown lacks %q:\n%s", want, md)
		}
	}
	for _, f := range []string{"r.json", "r.svg"} {
		if _, err := os.Stat(filepath.Join(dir, "new", f)); err != nil {
			t.Errorf("render did not write %s: %v", f, err)
		}
	}
}

// The PostgreSQL CPU section compares each -citus engine with its
// single-PostgreSQL counterpart of the same scenario, by server, with the
// coordinator's share.
func TestPGCPUSection(t *testing.T) {
	rep := &Report{Results: []Result{
		{Engine: "a", Scenario: "many", Throughput: 10000, MeanBatch: 100, PGCPUUsPerMsg: 40, PGCPUUsPerMsgBy: map[string]float64{"postgres": 40}},
		{Engine: "a-citus", Scenario: "many", Throughput: 7000, MeanBatch: 90, PGCPUUsPerMsg: 60,
			PGCPUUsPerMsgBy: map[string]float64{"worker h:2": 30, "coordinator": 3, "worker h:1": 27}},
		{Engine: "e-batch-citus", Scenario: "hot", Throughput: 500, PGCPUUsPerMsg: 10, PGCPUUsPerMsgBy: map[string]float64{"coordinator": 1, "worker h:1": 9},
			RunsPGCPU: []float64{12, 10, 8.5}},
		{Engine: "b", Scenario: "many", Throughput: 5000},
	}}
	var buf bytes.Buffer
	rep.writePGCPUMarkdown(&buf)
	out := buf.String()
	for _, want := range []string{
		"| many | a | 10,000 | - | 100.0 | 40.0 | - | - | - |",
		"| many | a-citus | 7,000 | 70% | 90.0 | 60.0 | coordinator 3.0, worker h:1 27.0, worker h:2 30.0 | 1.50x | 5.0% |",
		"| hot | e-batch-citus | 500 | - | - | 10.0 (8.5-12.0) | coordinator 1.0, worker h:1 9.0 | - | 10.0% |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing row %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| b |") {
		t.Errorf("an engine without PostgreSQL CPU has a row:\n%s", out)
	}
	buf.Reset()
	(&Report{Results: []Result{{Engine: "b", Scenario: "many"}}}).writePGCPUMarkdown(&buf)
	if buf.Len() != 0 {
		t.Errorf("section without any PostgreSQL CPU: %q", buf.String())
	}
}

// Round 3's targets compare engines of the same run: Citus with single
// PostgreSQL (throughput, and the PostgreSQL CPU per message with the
// coordinator's share), the group commit on MySQL with the seed's Redis INCR
// + INSERT on MySQL.
func TestStoreTargets(t *testing.T) {
	results := []Result{
		{Engine: "a", Scenario: "many", Throughput: 40000, PGCPUUsPerMsg: 20},
		{Engine: "a-citus", Scenario: "many", Throughput: 26000, PGCPUUsPerMsg: 34, PGCPUUsPerMsgBy: map[string]float64{"coordinator": 0.5}},
		{Engine: "a", Scenario: "hot", Throughput: 60000},
		{Engine: "a-citus", Scenario: "hot", Throughput: 45000},
		{Engine: "a-mysql", Scenario: "many", Throughput: 20000},
		{Engine: "b-mysql", Scenario: "many", Throughput: 5000},
	}
	got := map[string]TargetCheck{}
	for _, c := range storeTargets(results) {
		got[c.Target] = c
	}
	for target, want := range map[string]string{
		"many: (a-citus) >= 60% of (a)":                                             "met",     // 65%
		"many: (a-citus) PostgreSQL CPU/msg <= 1.8x (a)'s, coordinator <= 5% of it": "met",     // 1.70x, 1.5%
		"hot: (a-citus) >= 80% of (a)":                                              "not met", // 75%
		"many: (a-mysql) >= 3x (b-mysql)":                                           "met",     // 4.0x
	} {
		if got[target].Status != want {
			t.Errorf("%s: %q (%s), want %q", target, got[target].Status, got[target].Measured, want)
		}
	}
	if m := got["many: (a-citus) PostgreSQL CPU/msg <= 1.8x (a)'s, coordinator <= 5% of it"].Measured; m != "1.70x, coordinator 1.5%" {
		t.Errorf("measured %q", m)
	}
	results[1].PGCPUUsPerMsgBy["coordinator"] = 3 // 8.8%
	for _, c := range storeTargets(results) {
		if strings.HasPrefix(c.Target, "many: (a-citus) PostgreSQL") && c.Status != "not met" {
			t.Errorf("coordinator at 8.8%%: %q", c.Status)
		}
	}
}

func TestRoundOrderRotatesTheEngines(t *testing.T) {
	specs := []EngineSpec{{Key: "a"}, {Key: "b"}, {Key: "c"}}
	keys := func(ss []EngineSpec) string {
		var k []string
		for _, s := range ss {
			k = append(k, s.Key)
		}
		return strings.Join(k, ",")
	}
	for rep, want := range []string{"a,b,c", "b,c,a", "c,a,b", "a,b,c"} {
		if got := keys(roundOrder(specs, rep)); got != want {
			t.Errorf("round %d: %s, want %s", rep, got, want)
		}
	}
	if got := keys(specs); got != "a,b,c" {
		t.Errorf("roundOrder changed its argument: %s", got)
	}
	if roundOrder(nil, 3) != nil {
		t.Error("no engines: want none")
	}
}
