package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
)

// listView is a cluster view with the given members.
type listView []Member

func (listView) Version() uint64         { return 3 }
func (v listView) Members() []Member     { return v }
func (listView) Partitions() []Partition { return make([]Partition, 4) }

// One node's /console/api/cluster shows every member: itself from memory,
// a peer from the peer's console (with its hot conversations only when the
// caller's token is passed on), and a member that does not answer as
// unreachable.
func TestClusterGathersEveryMember(t *testing.T) {
	const token = "Bearer s3cret"
	auth := func(r *http.Request) bool { return r.Header.Get("Authorization") == token }
	partOf := func(conv string) (uint32, bool) { return uint32(len(conv) % 4), true }
	peerSends := NewSendCounter()
	peer := New(Config{NodeID: "n2", Cluster: listView{{NodeID: "n2", Self: true}}, Reader: fakeReader{},
		Sends: peerSends, PartitionOf: partOf, Authorize: auth, SampleEvery: time.Hour})
	defer peer.Close()
	srv := httptest.NewServer(peer)
	defer srv.Close()
	for range 5 {
		_, _ = peerSends.Wrap(nopSender{}).Send(context.Background(), sequencer.SendRequest{ConvID: "g:peer-hot"})
	}
	peer.sample(time.Now())

	dead := "127.0.0.1:1"
	self := New(Config{NodeID: "n1", Reader: fakeReader{}, PartitionOf: partOf, Authorize: auth, SampleEvery: time.Hour,
		Cluster: listView{{NodeID: "n1", APIAddr: "127.0.0.1:9", Self: true}, {NodeID: "n2", APIAddr: strings.TrimPrefix(srv.URL, "http://")}, {NodeID: "n3", APIAddr: dead}}})
	defer self.Close()

	type answer struct {
		Nodes []ClusterNode
		Hot   []HotConv      `json:"hotConversations"`
		Parts []HotPartition `json:"hotPartitions"`
		Need  bool           `json:"hotConversationsNeedToken"`
	}
	ask := func(authorization string) answer {
		req := httptest.NewRequest(http.MethodGet, "/console/api/cluster", nil)
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		rec := httptest.NewRecorder()
		self.ServeHTTP(rec, req)
		var a answer
		if err := json.NewDecoder(rec.Body).Decode(&a); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("cluster: %d %v", rec.Code, err)
		}
		return a
	}
	a := ask(token)
	if len(a.Nodes) != 3 || !a.Nodes[0].Reachable || !a.Nodes[1].Reachable || a.Nodes[2].Reachable || a.Nodes[2].Error == "" {
		t.Fatalf("nodes %+v: want n1 and n2 reachable, n3 not, with why", a.Nodes)
	}
	if a.Nodes[1].Summary == nil || a.Nodes[1].Summary.Node != "n2" || a.Nodes[1].ConsoleURL != srv.URL+"/console/" {
		t.Fatalf("n2: %+v", a.Nodes[1])
	}
	if len(a.Hot) != 1 || a.Hot[0].ConvID != "g:peer-hot" || a.Need || len(a.Parts) != 1 {
		t.Fatalf("with the token: hot %+v, partitions %+v, need %v", a.Hot, a.Parts, a.Need)
	}
	// Without it: no conversation ids, the partitions still.
	a = ask("")
	if len(a.Hot) != 0 || !a.Need || len(a.Parts) != 1 || a.Parts[0].SendsPerSec == 0 {
		t.Fatalf("without the token: hot %+v, partitions %+v, need %v", a.Hot, a.Parts, a.Need)
	}
}
