package membership

import "github.com/sequencer-im/sequencer/persist"

// CheckFences is the store-side fence decision, written once for every
// store (PostgreSQL, Citus, MySQL, SQLite, the in-memory Mem): a store calls
// it inside its commit's transaction, after reading the lease rows it needs,
// and commits only on nil.
//
//   - Every fence of fences must hold (persist.Fences leaves the zero one
//     out; a head-row refusal may name it): holds reports whether the partition's
//     lease row, as the transaction reads it, names the fence's owner at its
//     epoch (LeaseHolds). The fences that do not are returned as a
//     *persist.StaleFenceError, in the order given (persist.Fences orders
//     them by partition).
//   - Then an unfenced commit (unfenced set: some batch carries the zero
//     Fence) lands only while no partition is held: held, asked only then,
//     reports whether any is; if one is, persist.ErrUnfenced.
//
// An error of holds or held is returned as it is (the store's own, mapped
// by its driver). Nothing is written in any refusal.
func CheckFences(fences []persist.Fence, unfenced bool, holds func(persist.Fence) (bool, error), held func() (bool, error)) error {
	var stale []persist.Fence
	for _, f := range fences {
		ok, err := holds(f)
		if err != nil {
			return err
		}
		if !ok {
			stale = append(stale, f)
		}
	}
	if len(stale) > 0 {
		return &persist.StaleFenceError{Fences: stale}
	}
	if unfenced && held != nil {
		h, err := held()
		if err != nil {
			return err
		}
		if h {
			return persist.ErrUnfenced
		}
	}
	return nil
}

// LeaseHolds reports whether a partition's lease row (found: the row
// exists) holds f: it names f's owner at f's epoch.
func LeaseHolds(f, lease persist.Fence, found bool) bool {
	return found && lease.Owner == f.Owner && lease.Epoch == f.Epoch
}

// InLeases is a holds function for CheckFences over lease rows read at
// once, keyed by partition.
func InLeases(leases map[uint32]persist.Fence) func(persist.Fence) (bool, error) {
	return func(f persist.Fence) (bool, error) {
		l, ok := leases[f.Partition]
		return LeaseHolds(f, l, ok), nil
	}
}

// NotIn is a holds function for CheckFences when the store's own check
// (SQL inside the transaction) already named the fences that do not hold.
func NotIn(stale []persist.Fence) func(persist.Fence) (bool, error) {
	return func(f persist.Fence) (bool, error) {
		for _, s := range stale {
			if s == f {
				return false, nil
			}
		}
		return true, nil
	}
}
