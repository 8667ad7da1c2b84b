package postgres

// Test hooks: set only by this package's tests.

// onCommitBackend makes every commit call f with the backend pid of its
// connection, after the connection is taken from its pool and before
// anything is sent (a test stops that backend to stall the commit).
func (s *Store) onCommitBackend(f func(pid uint32)) { s.commitBackend = f }
