// Package buildinfo says which build of sequencer is running: the version, the
// commit and the Go version. `make build` sets the version (and may set the
// commit) with -ldflags -X; otherwise both come from the build information the
// Go toolchain embeds (runtime/debug.ReadBuildInfo). It owns no other state and
// must never fail: a field it cannot learn reads "unknown" (commit) or "dev"
// (version).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by `make build`:
//
//	-ldflags "-X github.com/sequencer-im/sequencer/buildinfo.version=v0.2.0
//	          -X github.com/sequencer-im/sequencer/buildinfo.commit=0123abc"
var (
	version string
	commit  string
)

// Info is one build's identity.
type Info struct {
	Version   string // release version (v0.2.0), the module version for `go install ...@v`, else "dev"
	Commit    string // VCS revision, with "-dirty" when the tree had uncommitted changes; "unknown" when not recorded
	GoVersion string // the Go toolchain that built the binary (go1.26.8)
}

// Get returns this binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, bi)
}

// resolve picks each field from the link-time values first, then the embedded
// build information.
func resolve(ldVersion, ldCommit string, bi *debug.BuildInfo) Info {
	in := Info{Version: ldVersion, Commit: ldCommit, GoVersion: runtime.Version()}
	if bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		if in.Commit == "" {
			var rev string
			var modified bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if rev != "" {
				in.Commit = rev
				if modified {
					in.Commit += "-dirty"
				}
			}
		}
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	return in
}

// String is the one line `sequencer version` prints.
func (i Info) String() string {
	return fmt.Sprintf("sequencer %s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}
