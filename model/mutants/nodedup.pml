/* Mutant nodedup: resend dedup removed: no memo or pending-entry check in conv.Core.Send and no uk_from_client in the store.
 * EXPECT: stored_once
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_NODEDUP
#include "../ownership.pml"
