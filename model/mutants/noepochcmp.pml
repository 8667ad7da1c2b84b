/* Mutant noepochcmp: the Citus variant (HEAD_FENCE) without its epoch
 * compare (head_epoch <= the fence's epoch): only the head compare-and-set
 * is left, and a stale owner that re-read the head commits after the newer
 * owner wrote.
 * EXPECT: one_writer
 * BOUNDS:
 * model/check.sh passes only if spin finds this violation. */
#define HEAD_FENCE
#define MUT_NOEPOCHCMP
#include "../ownership.pml"
