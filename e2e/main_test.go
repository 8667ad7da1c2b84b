package e2e

import (
	"testing"

	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// runWithPG runs the tests and stops the throwaway servers (PostgreSQL,
// MariaDB, Citus) it started, if any.
func runWithPG(m *testing.M) int {
	defer citustest.Stop()
	defer pgtest.Stop()
	defer mysqltest.Stop()
	return m.Run()
}
