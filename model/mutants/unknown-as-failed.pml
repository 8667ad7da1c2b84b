/* Mutant unknown-as-failed: an unknown commit outcome is taken for 'not landed' (persist.OutcomeOf / conv.Core.Committed answering at once instead of resolving).
 * EXPECT: err_final
 * BOUNDS: 
 * model/check.sh passes only if spin finds this violation. */
#define MUT_UNKNOWN_AS_FAILED
#include "../ownership.pml"
