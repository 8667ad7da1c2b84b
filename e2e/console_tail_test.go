package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleTailsLive: the console's conversation view, in headless
// Chromium, tails the conversation from the node's change feed: after a
// lookup, messages sent later appear at the top of the table in seq order
// and the head seq follows, without another lookup. About 10 s.
func TestConsoleTailsLive(t *testing.T) {
	browser(t) // skips before anything starts when browser tests are off
	n := startNode(t, "node", "--store", filepath.Join(t.TempDir(), "db"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := n.grpcClient()
	for i := 1; i <= 2; i++ {
		if _, err := send(ctx, c, "tail:1", 1, fmt.Sprint("before-", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	pg := openPage(t)
	pg.do("open the console", 30*time.Second, chromedp.Navigate("http://"+n.Addr+"/console/"))
	pg.do("look up tail:1", 20*time.Second,
		chromedp.SetValue(chromedp.CSS("#conv"), "tail:1"),
		chromedp.Click(chromedp.CSS("#lookup button")),
		chromedp.WaitVisible(chromedp.CSS("#headseq")))
	pg.waitJS("the lookup shows head 2", `document.querySelector('#headseq').textContent === '2'`, 10*time.Second)
	pg.waitJS("the view says it is live", `(document.querySelector('#tailstate')?.textContent || '').startsWith('live')`, 10*time.Second)
	for i := 1; i <= 3; i++ {
		if _, err := send(ctx, c, "tail:1", 1, fmt.Sprint("after-", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	pg.waitJS("the three new messages on top, newest first, and head 5",
		`document.querySelector('#headseq').textContent === '5' && `+
			`[...document.querySelectorAll('#convresult tbody tr')].map(r => r.dataset.seq).join(',') === '5,4,3,2,1'`, 15*time.Second)
	pg.shot("console-tails-live.png")
}
