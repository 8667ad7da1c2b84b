/* Mutant nofence: the in-commit fence check removed (persist/postgres/commit.go fenceCheckSQL: partition_lease (owner, epoch) FOR SHARE).
 * EXPECT: fenced
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_NOFENCE
#include "../ownership.pml"
