package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// browserEnv gates the headless-browser tests: .ci/run sets it (and installs
// Debian's chromium). With it set, a missing browser fails the test.
const browserEnv = "SEQUENCER_BROWSER_TESTS"

// artifactsEnv names a directory for screenshots (default: t.TempDir()).
const artifactsEnv = "SEQUENCER_TEST_ARTIFACTS"

func browser(t *testing.T) string {
	t.Helper()
	if os.Getenv(browserEnv) == "" {
		t.Skipf("browser test: set %s=1 (and install chromium) to run it; .ci/run does", browserEnv)
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("%s is set but no chromium was found in PATH: apt-get install -y chromium", browserEnv)
	return ""
}

func artifactsDir(t *testing.T) string {
	if d := os.Getenv(artifactsEnv); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// TestConsoleShowsFailover loads the web console of a real 3-node cluster
// under load in headless Chromium: one node's page shows every node's
// figures (messages/s and store transactions/s apart, latency, pending
// sends against the limit, actors), links to the others' consoles, the
// events (joins), the hot conversations and the partition map split three
// ways, with every time in UTC. Then it SIGKILLs one node and sees its
// death, the failover of its partitions with the number moved, and the node
// shown unreachable, then gone; seconds without sends are a gap in the
// latency chart. The charts and the conversation lookup work. Screenshots of the cluster under load
// and after the kill go to $SEQUENCER_TEST_ARTIFACTS.
func TestConsoleShowsFailover(t *testing.T) {
	browser(t) // skips before anything starts when browser tests are off
	const ttl = 2 * time.Second
	dsn := pgtest.NewDatabase(t)
	n1 := startNode(t, "n1", clusterArgs(t, dsn, "n1", ttl.String())...)
	n2 := startNode(t, "n2", clusterArgs(t, dsn, "n2", ttl.String())...)
	n3 := startNode(t, "n3", clusterArgs(t, dsn, "n3", ttl.String())...)

	// Load through every node, one conversation ("console:hot") far busier
	// than the others, so the charts, the hot tables and the lookup have
	// something to show.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var paused atomic.Bool // no sends while set: the charts must show a gap
	for w, n := range []*proc{n1, n2, n3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := n.grpcClient()
			for i := 0; ctx.Err() == nil; i++ {
				conv := "console:hot"
				if i%4 == 0 {
					conv = fmt.Sprintf("console:%d", (i/4)%100)
				}
				if !paused.Load() {
					sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
					_, _ = send(sctx, c, conv, 7, fmt.Sprintf("console-%d-%d", w, i), []byte("hello"))
					scancel()
				}
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
	}

	pg := openPage(t)
	owners := func(node string) string {
		return fmt.Sprintf(`document.querySelectorAll('#partmap .cell[data-owner=%q]').length`, node)
	}
	row := func(node string) string {
		return fmt.Sprintf(`document.querySelector('#nodes tbody tr[data-node=%q]')`, node)
	}
	field := func(node, f string) string {
		return fmt.Sprintf(`(%s?.querySelector('td[data-field=%q]')?.textContent || '')`, row(node), f)
	}

	pg.do("open the console", 30*time.Second, chromedp.Navigate("http://"+n1.Addr+"/console/"))
	pg.waitJS("three members listed", `document.querySelectorAll('#members tbody tr[data-node]').length === 3`, 30*time.Second)
	pg.waitJS("no Citus workers shown on plain PostgreSQL", `document.querySelector('#workers-section').hidden`, time.Second)
	pg.waitJS("heartbeat ages below the member TTL",
		fmt.Sprintf(`[...document.querySelectorAll('#members td[data-age-ms]')].every(td => +td.dataset.ageMs >= 0 && +td.dataset.ageMs < %d)`, ttl.Milliseconds()), 10*time.Second)
	pg.waitJS("271 partitions split between n1, n2 and n3",
		fmt.Sprintf(`document.querySelectorAll('#partmap .cell').length === 271 && %[1]s > 0 && %[2]s > 0 && %[3]s > 0 && %[1]s + %[2]s + %[3]s === 271`,
			owners("n1"), owners("n2"), owners("n3")), 30*time.Second)

	// One page, every node: each row has its own figures, read from its own
	// console (n1's page, n2's and n3's numbers).
	for _, n := range []string{"n1", "n2", "n3"} {
		pg.waitJS(n+"'s row with messages/s, store transactions/s and latency",
			fmt.Sprintf(`%s?.dataset.reachable === 'true' && +%s > 0 && +%s > 0 && %s.includes('ms') && +%s > 0`,
				row(n), field(n, "messages"), field(n, "transactions"), field(n, "latency"), field(n, "actors")), 30*time.Second)
	}
	pg.waitJS("pending sends shown against the limit", row("n2")+`.children[4].textContent.includes(' / ')`, 10*time.Second)
	pg.waitJS("links to the other nodes' consoles",
		fmt.Sprintf(`%s.querySelector('a')?.href === 'http://%s/console/' && %s.querySelector('a')?.href === 'http://%s/console/' && !%s.querySelector('a')`,
			row("n2"), n2.Addr, row("n3"), n3.Addr, row("n1")), 10*time.Second)
	pg.waitJS("a line per node in the messages chart",
		`['n1','n2','n3'].every(n => [...document.querySelectorAll('#chart-msgs polyline[data-node="' + n + '"]')].some(l => l.getAttribute('points').split(' ').length >= 3))`, 30*time.Second)
	pg.waitJS("the hot conversation on top", `document.querySelector('#hot-convs tbody tr')?.dataset.conv === 'console:hot'`, 30*time.Second)
	pg.waitJS("the hot partition on top, with its owner",
		`document.querySelector('#hot-parts tbody tr')?.dataset.p === document.querySelector('#hot-convs tbody tr td:nth-child(2)').textContent`, 10*time.Second)
	// n2 and n3 joined after n1 started: n1 saw them join (in UTC).
	pg.waitJS("joins in the events, in UTC",
		`['n2','n3'].every(n => [...document.querySelectorAll('#events tr[data-kind="join"]')].some(r => r.dataset.node === n && /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/.test(r.cells[0].textContent)))`, 10*time.Second)
	pg.waitJS("the header clock in UTC", `/^updated \d\d:\d\d:\d\d UTC$/.test(document.querySelector('#status').textContent)`, 5*time.Second)
	epochTitle := pg.eval("epoch on hover", `document.querySelector('#partmap .cell').title`)
	if ok, _ := filepath.Match(`partition 0 · owner n? · epoch *`, epochTitle); !ok {
		t.Fatalf("cell title %q: want partition, owner and epoch", epochTitle)
	}

	pg.do("conversation lookup", 20*time.Second,
		chromedp.SetValue(chromedp.CSS("#conv"), "console:1"),
		chromedp.Click(chromedp.CSS("#lookup button")),
		chromedp.WaitVisible(chromedp.CSS("#headseq")))
	pg.waitJS("lookup shows messages", `document.querySelectorAll('#convresult tbody tr').length > 0 && document.querySelector('#headseq').textContent !== '0'`, 10*time.Second)
	pg.shot("console-3-nodes-under-load.png")

	n3Held := pg.eval("n3's partitions", "String("+owners("n3")+")")
	n3.kill()
	killed := time.Now()
	// Failover: n3's member lease (ttl) expires, then n1 and n2 take its
	// partitions (README, "A cluster": about TTL + heartbeat + the
	// takeover). The bound is generous so a slow machine does not fail it.
	bound := 5*ttl + 10*time.Second
	pg.waitJS("n3 shown unreachable while its row lasts, or gone",
		`!`+row("n3")+` || `+row("n3")+`.dataset.reachable === 'false'`, bound)
	pg.waitJS("all 271 partitions owned by n1 and n2 after n3's crash", owners("n1")+` + `+owners("n2")+` === 271`, bound)
	t.Logf("partitions moved on the page %v after the kill (member TTL %v)", time.Since(killed).Round(100*time.Millisecond), ttl)
	pg.waitJS("n3 gone from the members", `document.querySelectorAll('#members tbody tr').length === 2 && !document.querySelector('#members tbody tr[data-node="n3"]')`, bound)
	pg.waitJS("n3's death and the failovers of all its partitions in the events",
		fmt.Sprintf(`!!document.querySelector('#events tr[data-kind="death"][data-node="n3"]') && `+
			`[...document.querySelectorAll('#events tr[data-kind="failover"]')].filter(r => r.cells[4].textContent.includes('of n3')).reduce((a, r) => a + +r.cells[3].textContent, 0) === %s`, n3Held), bound)
	pg.waitJS("n1 and n2 still plotted", `['n1','n2'].every(n => document.querySelectorAll('#chart-msgs polyline[data-node="' + n + '"]').length > 0)`, 10*time.Second)
	pg.shot("console-after-kill-9.png")

	// Seconds without sends are a gap in the latency chart, not a line
	// drawn across them.
	p99Lines := pg.eval("n1's p99 segments", `String(document.querySelectorAll('#chart-p99 polyline[data-node="n1"]').length)`)
	paused.Store(true)
	pg.waitJS("n1 shows no sends", field("n1", "latency")+` === 'no sends'`, 30*time.Second)
	paused.Store(false)
	pg.waitJS("the latency line of n1 broken where there were no sends",
		fmt.Sprintf(`document.querySelectorAll('#chart-p99 polyline[data-node="n1"]').length > %s && %s.includes('ms')`, p99Lines, field("n1", "latency")), 30*time.Second)
	pg.shot("console-gap-without-sends.png")

	// A node with --auth-token-file: the lookup asks for the token, then works.
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("console-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	solo := startNode(t, "solo", "--store", filepath.Join(t.TempDir(), "db"), "--auth-token-file", tokens)
	pg.do("open the console of a node with tokens", 30*time.Second, chromedp.Navigate("http://"+solo.Addr+"/console/"))
	pg.waitJS("single node listed", `!!document.querySelector('#members tbody tr td') && document.querySelector('#partmap').innerText.includes('single node')`, 30*time.Second)
	pg.do("lookup without a token", 20*time.Second,
		chromedp.SetValue(chromedp.CSS("#conv"), "g:1"),
		chromedp.Click(chromedp.CSS("#lookup button")))
	pg.waitJS("the token field appears after a 401", `!document.querySelector('#token').hidden && document.querySelector('#convresult').innerText.includes('bearer token')`, 10*time.Second)
	pg.do("lookup with the token", 20*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), "console-secret"),
		chromedp.Click(chromedp.CSS("#lookup button")))
	pg.waitJS("lookup answered with the token", `document.querySelector('#headseq')?.textContent === '0'`, 10*time.Second)
}

// page is one tab of a headless Chromium, driven step by step; every step
// is bounded and fails the test when it fails.
type page struct {
	t     *testing.T
	ctx   context.Context
	shots string // where screenshots go
}

// openPage starts Chromium (browser: skipped or failed as that says),
// stopped when the test ends.
func openPage(t *testing.T) *page {
	t.Helper()
	chrome := browser(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Headless, chromedp.WindowSize(1280, 1000))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() { bcancel(); acancel() })
	// The first Run starts the browser and must not carry a timeout (it
	// would stop the browser); later steps are bounded one by one.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &page{t: t, ctx: bctx, shots: artifactsDir(t)}
}

func (p *page) do(what string, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	rctx, rcancel := context.WithTimeout(p.ctx, d)
	defer rcancel()
	if err := chromedp.Do(rctx, steps...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JS expression whose value is a string.
func (p *page) eval(what, expr string) string {
	p.t.Helper()
	rctx, rcancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer rcancel()
	v, err := chromedp.Run(rctx, chromedp.Evaluate[string](expr))
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// waitJS polls a JS expression until it is true.
func (p *page) waitJS(what, expr string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		if p.eval(what, "String(!!("+expr+"))") == "true" {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: not within %v; page shows:\n%s", what, d,
				p.eval("page text", `document.querySelector("main").innerText.slice(0, 3000)`))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shot saves a screenshot (PNG) under the artifacts directory.
func (p *page) shot(name string) {
	p.t.Helper()
	rctx, rcancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer rcancel()
	png, err := chromedp.Run(rctx, chromedp.FullScreenshot(100) /* 100: PNG */)
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(p.shots, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot %s", path)
}
