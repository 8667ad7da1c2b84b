/* Mutant earlyack: the writer acks a batch when it hands it to the store, before the commit (conv.Core.land called from form).
 * EXPECT: acked_stored
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_EARLYACK
#include "../ownership.pml"
