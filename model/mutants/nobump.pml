/* Mutant nobump: Acquire does not bump the epoch (persist/postgres/cluster.go ClusterStore.Acquire, membership.Mem.Acquire: epoch = epoch + 1).
 * EXPECT: fenced
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_NOBUMP
#include "../ownership.pml"
