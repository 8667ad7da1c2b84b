/* Mutant restart-same-lease: a process restarted after a crash joins under the incarnation name it had (cluster.Node's newIncarnation made deterministic, e.g. the node id alone), and ClusterStore.Acquire keeps the epoch of a lease its incarnation already holds (an "idempotent" re-acquire). The crashed process's commit still in flight then carries the new process's fence and lands under its lease. Each change alone passes (docs/TESTING.md, "The mutants"); only a crash shows the pair.
 * EXPECT: fenced
 * BOUNDS: -UMAXINC -DMAXINC=2 -UNOCRASH
 * model/check.sh passes only if spin finds this violation. */
#define MUT_SAMEINC
#define MUT_KEEPOWN
#include "../ownership.pml"
