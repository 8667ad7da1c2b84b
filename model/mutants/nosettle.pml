/* Mutant nosettle: the re-read after an unknown outcome does not settle first (actor convActor.execute's Resolve without persist.Store.Settle): a stalled transaction lands after the senders were told it did not.
 * EXPECT: err_final
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_NOSETTLE
#include "../ownership.pml"
