/* Mutant nobump-headfence: the Citus variant (HEAD_FENCE) with an Acquire
 * that does not bump the epoch: a stale owner's epoch equals the new
 * owner's, so head_epoch <= mine lets it commit after the new owner wrote.
 * EXPECT: one_writer
 * BOUNDS:
 * model/check.sh passes only if spin finds this violation. */
#define HEAD_FENCE
#define MUT_NOBUMP
#include "../ownership.pml"
