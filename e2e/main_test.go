package e2e

import (
	"testing"

	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// runWithPG runs the tests and stops pgtest's throwaway server, if it started one.
func runWithPG(m *testing.M) int {
	defer pgtest.Stop()
	defer mysqltest.Stop()
	return m.Run()
}
