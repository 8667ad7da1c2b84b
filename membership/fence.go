package membership

import "github.com/sequencer-im/sequencer"

// CheckFences is the store-side fence decision, written once for every
// store (PostgreSQL, Citus, MySQL, SQLite, the in-memory Mem): a store calls
// it inside its commit's transaction, after reading the lease rows it needs,
// and commits only on nil.
//
//   - Every fence of fences must hold (sequencer.Fences leaves the zero one
//     out; a head-row refusal may name it): holds reports whether the partition's
//     lease row, as the transaction reads it, names the fence's owner at its
//     epoch (LeaseHolds). The fences that do not are returned as a
//     *sequencer.StaleFenceError, in the order given (sequencer.Fences orders
//     them by partition).
//   - Then an unfenced commit (unfenced set: some batch carries the zero
//     Fence) lands only while no partition is held: held, asked only then,
//     reports whether any is; if one is, sequencer.ErrUnfenced.
//
// An error of holds or held is returned as it is (the store's own, mapped
// by its driver). Nothing is written in any refusal.
func CheckFences(fences []sequencer.Fence, unfenced bool, holds func(sequencer.Fence) (bool, error), held func() (bool, error)) error {
	var stale []sequencer.Fence
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
		return &sequencer.StaleFenceError{Fences: stale}
	}
	if unfenced && held != nil {
		h, err := held()
		if err != nil {
			return err
		}
		if h {
			return sequencer.ErrUnfenced
		}
	}
	return nil
}

// LeaseHolds reports whether a partition's lease row (found: the row
// exists) holds f: it names f's owner at f's epoch.
func LeaseHolds(f, lease sequencer.Fence, found bool) bool {
	return found && lease.Owner == f.Owner && lease.Epoch == f.Epoch
}

// InLeases is a holds function for CheckFences over lease rows read at
// once, keyed by partition.
func InLeases(leases map[uint32]sequencer.Fence) func(sequencer.Fence) (bool, error) {
	return func(f sequencer.Fence) (bool, error) {
		l, ok := leases[f.Partition]
		return LeaseHolds(f, l, ok), nil
	}
}

// NotIn is a holds function for CheckFences when the store's own check
// (SQL inside the transaction) already named the fences that do not hold.
func NotIn(stale []sequencer.Fence) func(sequencer.Fence) (bool, error) {
	return func(f sequencer.Fence) (bool, error) {
		for _, s := range stale {
			if s == f {
				return false, nil
			}
		}
		return true, nil
	}
}
