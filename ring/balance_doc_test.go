package ring

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docs/OPERATIONS.md "Partition balance" lists, for 2..6 members named
// n1..nN under the default config, each member's partition count and the
// load bound: the ring still gives those numbers.
func TestBalanceTableInOperationsDoc(t *testing.T) {
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| (\d) \| ([\d, ]+) \| (\d+) \| [\d.]+ \|$`)
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) != 5 {
		t.Fatalf("found %d rows of the balance table, want 5 (2..6 members)", len(rows))
	}
	for _, r := range rows {
		n, _ := strconv.Atoi(r[1])
		var members []Node
		for i := 1; i <= n; i++ {
			members = append(members, Node{NodeID: fmt.Sprintf("n%d", i)})
		}
		rg, err := New(members, DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range members {
			got = append(got, strconv.Itoa(len(rg.OwnedBy(m.NodeID))))
		}
		if strings.Join(got, ", ") != r[2] || strconv.Itoa(loadCap(DefaultPartitions, n, DefaultLoad)) != r[3] {
			t.Errorf("%d members: the ring gives %s (bound %d), the doc says %s (bound %s)",
				n, strings.Join(got, ", "), loadCap(DefaultPartitions, n, DefaultLoad), r[2], r[3])
		}
	}
}
