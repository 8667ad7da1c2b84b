package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/sequencer-im/sequencer", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0364025abc"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	installed := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}}
	for _, tc := range []struct {
		name              string
		ldVersion, ldComm string
		bi                *debug.BuildInfo
		want              Info
	}{
		{"make build: -X version, commit from VCS", "v0.2.0", "", vcs, Info{"v0.2.0", "0364025abc-dirty", "go1.26.8"}},
		{"-X beats build info", "v0.2.0", "feedbee", vcs, Info{"v0.2.0", "feedbee", "go1.26.8"}},
		{"plain go build in a checkout", "", "", vcs, Info{"dev", "0364025abc-dirty", "go1.26.8"}},
		{"go install ...@v0.1.0", "", "", installed, Info{"v0.1.0", "unknown", "go1.26.8"}},
		{"no build info", "", "", nil, Info{"dev", "unknown", runtime.Version()}},
	} {
		if got := resolve(tc.ldVersion, tc.ldComm, tc.bi); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestGetNeverEmpty(t *testing.T) {
	in := Get()
	if in.Version == "" || in.Commit == "" || in.GoVersion != runtime.Version() {
		t.Fatalf("Get() = %+v: a field is empty or the Go version is not this toolchain's", in)
	}
}
