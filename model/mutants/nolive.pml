/* Mutant nolive: a lease is taken from a live owner that did not release it (ClusterStore.Acquire's 'free, ours, or not a live member' condition removed).
 * EXPECT: live_holder
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_NOLIVE
#include "../ownership.pml"
