package server

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// The console is served with the admin endpoints: on the API port by
// default, on --admin-listen when set (and then not on the API port); with
// --auth-token-file its conversation lookup needs a token.
func TestConsoleMountedWithTheAdminEndpoints(t *testing.T) {
	one := start(t, Config{NodeID: "solo"}, nil)
	if code, body := get(t, "http://"+one.Addr()+"/console/"); code != 200 || !strings.Contains(body, "sequencer console") {
		t.Fatalf("console on the API port: %d", code)
	}
	if code, body := get(t, "http://"+one.Addr()+"/console/api/members"); code != 200 || !strings.Contains(body, `"nodeId":"solo"`) || !strings.Contains(body, `"self":true`) || !strings.Contains(body, `"version":"`) {
		t.Fatalf("members of a single node: %d %s", code, body)
	}
	if code, body := get(t, "http://"+one.Addr()+"/console/api/conversation?conv_id=g:1"); code != 200 || !strings.Contains(body, `"headSeq":"0"`) {
		t.Fatalf("lookup without tokens configured: %d %s", code, body)
	}
	if code, body := get(t, "http://"+one.Addr()+"/console/api/workers"); code != 200 || !strings.Contains(body, `"distributed":false`) {
		t.Fatalf("workers of a store that is not Citus: %d %s", code, body)
	}

	adm := start(t, Config{AdminListen: "127.0.0.1:0"}, nil)
	if code, _ := get(t, "http://"+adm.Addr()+"/console/"); code != http.StatusNotFound {
		t.Fatalf("API port still serves the console with --admin-listen: %d", code)
	}
	if code, _ := get(t, "http://"+adm.AdminAddr()+"/console/"); code != 200 {
		t.Fatalf("console on the admin port: %d", code)
	}

	file := filepath.Join(t.TempDir(), "tokens")
	if err := writeFile(file, "console-token\n"); err != nil {
		t.Fatal(err)
	}
	tok := start(t, Config{AuthTokenFile: file}, nil)
	url := "http://" + tok.Addr() + "/console/api/conversation?conv_id=g:1"
	if code, _ := get(t, url); code != http.StatusUnauthorized {
		t.Fatalf("lookup without the token: %d, want 401", code)
	}
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer console-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("lookup with the token: %d", resp.StatusCode)
	}
	if code, _ := get(t, "http://"+tok.Addr()+"/console/api/partitions"); code != 200 {
		t.Fatalf("partitions need no token (like /metrics): %d", code)
	}
}
