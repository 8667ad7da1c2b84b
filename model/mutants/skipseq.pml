/* Mutant skipseq: the writer assigns seqs from head+2 while its PrevHead says head (conv.Core.form): the compare-and-set passes and leaves a hole.
 * EXPECT: contiguous
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_SKIPSEQ
#include "../ownership.pml"
