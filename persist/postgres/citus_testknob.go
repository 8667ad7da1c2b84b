package postgres

import "os"

// TestNoLeaseCheckEnv, for tests only: when set (to anything) in a node's
// environment, its Citus store skips the lease-cache check before a commit
// (checkFences), so a stale owner's commits reach the workers and only the
// head row's epoch fences them (the e2e zombie test on Citus freezes such a
// node past its lease). Never set it in production: the check is what
// refuses a stale owner without a round trip to a worker.
const TestNoLeaseCheckEnv = "SEQUENCER_TEST_CITUS_NO_LEASE_CHECK"

func noLeaseCheckFromEnv() bool { return os.Getenv(TestNoLeaseCheckEnv) != "" }
