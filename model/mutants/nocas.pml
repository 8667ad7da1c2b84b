/* Mutant nocas: the head compare-and-set removed (persist/postgres/commit.go headCheckSQL: head = PrevHead). With retention, uk_conv_seq no longer holds the trimmed seqs, so a writer with a stale head rewrites them.
 * EXPECT: one_per_seq
 * BOUNDS: -DRETENTION -UMAXGEN -DMAXGEN=3
 * CFLAGS: -DT_REVERSE
 * model/check.sh passes only if spin finds this violation. */
#define MUT_NOCAS
#include "../ownership.pml"
