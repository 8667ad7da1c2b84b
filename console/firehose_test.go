package console

import (
	"strings"
	"testing"
)

// TestFirehoseCard: with ServeFirehose the endpoint answers the node's
// backlog (64-bit counts as strings, like the API's JSON); without it, 404
// (the page then shows no card); the card's script is served.
func TestFirehoseCard(t *testing.T) {
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}})
	defer c.Close()
	if code, _ := get(t, c, "/console/api/firehose"); code != 404 {
		t.Fatalf("firehose endpoint without a firehose: %d, want 404", code)
	}
	c.ServeFirehose(func() Firehose {
		return Firehose{Publishing: false, LagMessages: 1200, LagSeconds: 31.5, Published: 7, Errors: 3, Partitions: 90,
			Behind: []FirehosePartition{{Partition: 4, Messages: 1000}, {Partition: 9, Messages: 200}}}
	})
	code, body := get(t, c, "/console/api/firehose")
	want := `{"node":"n1","publishing":false,"lagMessages":"1200","lagSeconds":31.5,"published":"7","errors":"3","partitions":90,"behind":[{"partition":4,"messages":"1000"},{"partition":9,"messages":"200"}]}`
	if code != 200 || strings.TrimSpace(body) != want {
		t.Fatalf("firehose: %d %s\nwant %s", code, body, want)
	}
	if code, body := get(t, c, "/console/firehose.js"); code != 200 || !strings.Contains(body, "api/firehose") {
		t.Fatalf("firehose.js: %d", code)
	}
	if _, page := get(t, c, "/console/"); !strings.Contains(page, `<script src="firehose.js">`) {
		t.Fatalf("the page does not load firehose.js")
	}
}
