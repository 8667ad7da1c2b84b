/*
 * The ownership protocol of a sequencer cluster, for spin (docs/TESTING.md,
 * "The model"). Checked exhaustively by model/check.sh, with its mutants
 * (model/mutants/*.pml: each #defines its MUT_* switches and #includes
 * this file).
 *
 * What is modelled, and after which code:
 *   - membership (membership/membership.go, persist/postgres/cluster.go):
 *     member rows with incarnations; a row can expire at any moment (the
 *     database clock: a paused or cut-off node stops renewing); a row is
 *     never revived; Join is refused while a live row of the same node id
 *     exists (takeOver=false);
 *   - partition leases (owner incarnation, epoch): Acquire only from a free,
 *     own or dead holder, epoch bumped; Release keeps the epoch;
 *   - the node's ownership core (ownership/ownership.go): held / moving
 *     partitions at an epoch, step-down (presumed dead, fenced, lost), rejoin
 *     as a new incarnation, handoff (StartHandoff, then release), crash;
 *   - the single writer of each conversation on each node (conv/conv.go):
 *     queue, one batch in flight, load head, commit, unknown outcome ->
 *     settle -> re-read -> answer, resend dedup (memo, pending entries, the
 *     store's uk_from_client with a lookup), passivation;
 *   - the store's commit (persist/postgres/commit.go): fence check (lease
 *     FOR SHARE), head compare-and-set, unique keys (uk_from_client,
 *     uk_conv_seq), all in one atomic transaction that may stay pending (a
 *     stalled backend) and land after its node was told "unknown";
 *     persist.Store.Settle terminates it; retention (Trim) of settled rows;
 *   - clients: a message is sent, resent with the same key to any node (a
 *     forward is such a resend), given up on (deadline: outcome unknown).
 *
 * Compile-time switches:
 *   HEAD_FENCE  the Citus variant (issue 20, DESIGN.md "Fencing on Citus"):
 *               the commit reads no lease; the head row carries head_epoch,
 *               and a commit lands only if head == PrevHead AND
 *               head_epoch <= the fence's epoch, and sets head_epoch to it.
 *   STRICT_ERR  the contract's per-key reading of "an error answer is final"
 *               even when an earlier attempt of the same key is still out
 *               with an unknown outcome (see docs/TESTING.md: it fails).
 *   RETENTION   retention (a_trim) on; the CI run sets it.
 *   NOCRASH     leave out a_crash (kill -9 and restart); the mutants'
 *               bounds set it (model/check.sh).
 *   FULL        also: an Acquire whose answer is lost, a step-down whose
 *               release fails.
 *   NOSYM       no node symmetry reduction (canon, below).
 *   LASTG       keep one_writer's ghost (set by HEAD_FENCE).
 *   N, C, M, MAXINC, MAXREINC, MAXGEN, MAXRESEND  the bounds (see below).
 *   MUT_*       the mutants' changes (model/mutants/).
 *
 * Why HEAD_FENCE is safe (the argument the checker confirms): epochs grow
 * with every Acquire of a partition, and head_epoch of a conversation only
 * grows (a commit needs head_epoch <= mine and sets it to mine). Once an
 * owner at epoch e2 committed to a conversation, head_epoch >= e2 > e1, so a
 * stale owner at e1 is refused for good: it can never commit after a newer
 * owner wrote (ONE_WRITER). Before the newer owner's first commit, the stale
 * commit passes only with head == its PrevHead, so it extends the log
 * contiguously, exactly as if it had landed before the take; the newer
 * owner's own commit then fails its compare-and-set (its PrevHead is
 * older), it re-reads the head and continues after the stale rows. Nothing
 * is lost or doubled, and every ack still follows a commit. What no longer
 * holds is the PostgreSQL variant's stronger FENCED: "no commit of an older
 * lease generation lands once a newer one was taken".
 *
 * Invariants (each an assert naming it; grep the name in pan's output):
 *   one_per_seq     at most one writer's commit succeeds per (conv, seq),
 *                   even across retention;
 *   contiguous      stored seqs are exactly trimmed+1..head (1..head before
 *                   any retention);
 *   acked_stored    every ack names the stored seq of that message;
 *   err_final       an error answer is never followed by the message being
 *                   stored (unless the client resent it, or an earlier
 *                   attempt's outcome was unknown to the client);
 *   never_back      a conversation's head never goes backwards;
 *   stored_once     a resend key is stored at most once (idempotent);
 *   one_writer      per conversation, the lease generations of successful
 *                   commits never go down: a stale owner never commits
 *                   after a newer owner wrote (asserted with LASTG, i.e.
 *                   in the Citus variant; fenced implies it otherwise);
 *   fenced          (PostgreSQL variant) every successful commit carries
 *                   the current lease generation of its partition;
 *   live_holder     a commit is refused for a stale fence only when the
 *                   fenced incarnation is presumed dead (its member row is
 *                   gone) or no longer believes it holds the partition:
 *                   nobody takes a lease from a live owner that did not
 *                   release it.
 *   bounds          the model's own array bounds (never an invariant of the
 *                   code).
 */

/* ---------------- bounds ---------------- */
#ifndef N
#define N 3          /* nodes */
#endif
#ifndef C
#define C 2          /* conversations = partitions: conversation c is in partition c */
#endif
#ifndef M
#define M 3          /* messages (resend keys) */
#endif
#if C == 1
#define MCONV(m) 0
#else
#define MCONV(m) ((m) == M-1 -> 1 : 0)   /* the last message is in conversation 1, the others in 0 */
#endif
#ifndef MAXINC
#define MAXINC 2     /* incarnations per node: one start plus one rejoin or restart */
#endif
#ifndef MAXREINC
#define MAXREINC (N*MAXINC)  /* new incarnations in all, after each node's first: rejoins and restarts */
#endif
#ifndef MAXGEN
#define MAXGEN 3     /* lease acquisitions per partition */
#endif
#ifndef MAXRESEND
#define MAXRESEND 1  /* resends in all (each message is sent once, plus these resends) */
#endif
#define MAXS 5       /* seqs per conversation the arrays hold */
#ifdef HEAD_FENCE
#define LASTG        /* one_writer's ghost (the PostgreSQL variant gets one_writer from fenced) */
#endif

#define NC(n,c) ((n)*C+(c))
#define BIT(wi) (1 << (wi))
#define OWNER(n) ((n)*4 + inc[n])      /* an incarnation's name; 0 is "no owner" */
#define ONODE(wo) ((wo) / 4)
#define OINC(wo) ((wo) % 4)
#define ROW(c,ws) row[(c)*(MAXS+1)+(ws)]

/* ---------------- names of the invariants (printed by pan) ---------------- */
hidden byte one_per_seq, contiguous, acked_stored, err_final, never_back, stored_once,
    one_writer, fenced, live_holder, bounds;

/* ---------------- the store (PostgreSQL) ---------------- */
byte minc[N];              /* cluster_member: live incarnation of node n, 0 = no live row */
byte lown[C];              /* partition_lease.owner (OWNER encoding), 0 = free */
byte lep[C];               /* partition_lease.epoch */
byte head[C];              /* conv_head.head */
#ifdef HEAD_FENCE
byte hepr[C];              /* conv_head.head_epoch (Citus variant) */
#endif
byte trimmed[C];           /* rows with seq <= trimmed[c] were deleted by retention */
byte row[C*(MAXS+1)];      /* im_message: ROW(c,s) = message+1 stored at seq s, 0 = none */

/* ghosts: what the checker remembers, never read by the protocol */
byte gen[C];               /* acquisitions so far of each partition (a lease generation) */
#ifdef LASTG
byte lastg[C];             /* generation of the last successful commit of conversation c */
#endif
byte seqw[C];              /* bit s: seq s of conversation c was ever written */
byte everStored;           /* bit m: message m was ever stored */
byte landedSeq[M];         /* the seq message m was stored at */

/* ---------------- nodes ---------------- */
#define NEW 0
#define ACTIVE 1
#define DOWN 2             /* stepped down, rejoining */
byte phase[N];
byte inc[N];               /* the process's current incarnation, 0 = never joined */
byte reinc;                /* rejoins and crashes so far, all nodes (each leads to a new incarnation) */
byte held[N];              /* bit p: ownership.Part.Held */
byte moving[N];            /* bit p: ownership.Part.Moving */
byte hep[N*C];             /* ownership.Part.Epoch */
byte hgen[N*C];            /* ghost: the generation the held lease was taken at */
bit fencedT[N];            /* ownership.TroubleFenced, set by Core.Refused */
#define HELD(n,p) (held[n] & BIT(p))

/* Dead values are cleared, so that states differing only in them are one. */
#define TX_FREE(n,c) tx[NC(n,c)] = TX_NONE; txbt[NC(n,c)] = 0; txprev[NC(n,c)] = 0; txbase[NC(n,c)] = 0; \
    txfo[NC(n,c)] = 0; txfe[NC(n,c)] = 0; txgen[NC(n,c)] = 0
#define BATCH_DONE(n,c) bt[NC(n,c)] = 0; bprev[NC(n,c)] = 0
#define FORGET_HEAD(n,c) hk[NC(n,c)] = 0; hd[NC(n,c)] = 0
#define MOVING(n,p) (moving[n] & BIT(p))

/* ---------------- conversation writers (conv.Core), one per (node, conv) -------- */
#define OP_NONE 0
#define OP_LOAD 1          /* Ready.LoadHead issued */
#define OP_COMMIT 3        /* Ready.Commit issued */
#define OP_RESOLVE 4       /* Ready.Resolve issued */
#define OP_RESOLVED 5      /* settled and re-read, Resolved not yet handled */
#define OP_LOOKUP 6        /* Ready.Lookup issued */
byte op[N*C];
bit hk[N*C];               /* headKnown */
byte hd[N*C];              /* head (or the value read, in OP_RESOLVED) */
byte q[N*C];               /* queued entries, bit m */
byte bt[N*C];              /* the batch in flight, bit m: seqs bprev+1.. in m order */
byte bprev[N*C];           /* its PrevHead */
byte memo[N*C];            /* committed keys the core remembers */
bit rmatch[N*C];           /* OP_RESOLVED: the rows read are the batch's */

/* ---------------- store transactions, one slot per (node, conv) ---------------- */
#define TX_NONE 0
#define TX_PENDING 1       /* sent, not yet run by the server (may never run) */
#define TX_OK 2
#define TX_STALE 3         /* fence refused (SQ001) */
#define TX_MISMATCH 4      /* head compare-and-set refused (SQ002) */
#define TX_CONFKEY 5       /* uk_from_client: a resend key already stored */
#define TX_CONFSEQ 6       /* uk_conv_seq */
#define TX_ABORTED 7       /* rolled back: never ran, or terminated */
byte tx[N*C];
byte txbt[N*C];            /* the rows it carries (bit m) */
byte txprev[N*C];          /* PrevHead (the compare-and-set) */
byte txbase[N*C];          /* its rows are at seqs txbase+1.. (== txprev but in MUT_SKIPSEQ) */
byte txfo[N*C];            /* fence owner */
byte txfe[N*C];            /* fence epoch */
byte txgen[N*C];           /* ghost: the generation of the fence */
bit orphan[N*C];           /* its process crashed: nobody waits for the answer */

/* ---------------- clients, one per message ---------------- */
byte cw[M];                /* n+1: an attempt is waiting at node n; 0: none */
bit sent[M];               /* the first attempt was made */
byte resends;              /* resends made so far, all messages */
bit acked[M];
bit unk[M];                /* an earlier attempt was given up on (outcome unknown) */
bit errf[M];               /* the last answer was an error that claims "not stored, ever" */

hidden byte wi, wk, ws, wt, wo;  /* scratch, meaningless between actions */

/* ---------------- helpers ---------------- */

/* Message m is held by some writer or transaction. */
#define HOLDS(n,c,m) (((q[NC(n,c)] | bt[NC(n,c)]) & BIT(m)) || (tx[NC(n,c)] != TX_NONE && (txbt[NC(n,c)] & BIT(m))))
#if N == 3
#define inflight(m) (HOLDS(0,MCONV(m),m) || HOLDS(1,MCONV(m),m) || HOLDS(2,MCONV(m),m))
#else
#define inflight(m) (HOLDS(0,MCONV(m),m) || HOLDS(1,MCONV(m),m))
#endif

/* the number of entries in the batch of writer (n,c) */
#define BTLEN(n,c) (((bt[NC(n,c)] & 1) != 0) + ((bt[NC(n,c)] & 2) != 0) + ((bt[NC(n,c)] & 4) != 0))


#define STORED_NOW(m) ((everStored & BIT(m)) && landedSeq[m] > trimmed[MCONV(m)])

/* The stored rows are exactly trimmed+1..head. */
inline check_contiguous(c) {
    ws = 1;
    do
    :: ws <= MAXS ->
        assert(contiguous || (ws <= trimmed[c] || ws > head[c] || ROW(c,ws) != 0));
        assert(contiguous || (ws <= head[c] || ROW(c,ws) == 0));
        ws++
    :: else -> break
    od;
    ws = 0
}

/* An ack reaches the client if its current attempt waits at node n. */
inline answer_ack(n, m, sq) {
    if
    :: cw[m] == n+1 ->
        cw[m] = 0;
        assert(acked_stored || ROW(MCONV(m), sq) == m+1);
        acked[m] = 1;  /* a second ack names the same seq: stored_once */
        unk[m] = 0     /* read only while not acked: cleared, so that states differing only in it are one */
    :: else -> skip
    fi
}

/* An error answer (retryable or not): "not stored, and will not be stored
 * unless you resend". The claim is checked when no earlier attempt is out
 * with an unknown outcome (STRICT_ERR: always). */
inline answer_err(n, m) {
    if
    :: cw[m] == n+1 ->
        cw[m] = 0;
#ifdef STRICT_ERR
        if
        :: !acked[m] ->
#else
        if
        :: !acked[m] && !unk[m] ->
#endif
            assert(err_final || !(everStored & BIT(m)));
            errf[m] = 1
        :: else -> skip
        fi
    :: else -> skip
    fi
}

/* conv.Core.failBatch / failQueue: every entry in mask gets an error. */
inline fail_mask(n, mask) {
    wi = 0;
    do
    :: wi < M ->
        if
        :: (mask) & BIT(wi) -> answer_err(n, wi)
        :: else -> skip
        fi;
        wi++
    :: else -> break
    od;
    wi = 0
}

/* conv.Core.land: the batch is stored at bprev+1..; ack every entry. */
inline land(n, c, newhead) {
    hd[NC(n,c)] = newhead; hk[NC(n,c)] = 1;
    memo[NC(n,c)] = memo[NC(n,c)] | bt[NC(n,c)];
    wk = 0; wt = 0;
    do
    :: wt < M ->
        if
        :: bt[NC(n,c)] & BIT(wt) -> wk++; answer_ack(n, wt, bprev[NC(n,c)] + wk)
        :: else -> skip
        fi;
        wt++
    :: else -> break
    od;
    wk = 0; wt = 0;
    BATCH_DONE(n,c)
}

/* conv.Core.form: ask ownership.Core.Fence, assign seqs head+1.. to the
 * queue, hand the batch to the store (commit.Writer.Submit ->
 * postgres.Store.Commit). */
inline form(n, c) {
    if
    :: phase[n] == ACTIVE && !fencedT[n] && HELD(n,c) && !MOVING(n,c) && tx[NC(n,c)] == TX_NONE ->
        bt[NC(n,c)] = q[NC(n,c)]; q[NC(n,c)] = 0;
#ifdef MUT_SKIPSEQ
        bprev[NC(n,c)] = hd[NC(n,c)] + 1;    /* mutant: seqs start at head+2 ... */
#else
        bprev[NC(n,c)] = hd[NC(n,c)];
#endif
        txprev[NC(n,c)] = hd[NC(n,c)];       /* ... while PrevHead says head */
        txbase[NC(n,c)] = bprev[NC(n,c)];
        txbt[NC(n,c)] = bt[NC(n,c)];
        txfo[NC(n,c)] = OWNER(n); txfe[NC(n,c)] = hep[NC(n,c)]; txgen[NC(n,c)] = hgen[NC(n,c)];
        tx[NC(n,c)] = TX_PENDING;
        op[NC(n,c)] = OP_COMMIT;
#ifdef MUT_EARLYACK
        land(n, c, bprev[NC(n,c)] + BTLEN(n,c))     /* mutant: ack on submit, before the commit */
#endif
    :: phase[n] == ACTIVE && !fencedT[n] && HELD(n,c) && !MOVING(n,c) && tx[NC(n,c)] != TX_NONE ->
        skip   /* the previous transaction of this slot is still out (model limit) */
    :: else ->
        fail_mask(n, q[NC(n,c)]); q[NC(n,c)] = 0   /* Fence refused: ErrNotOwner / ErrOwnershipMoving */
    fi
}

/* conv.Core.advance: start the next store operation if none is out. */
inline advance(n, c) {
    if
    :: op[NC(n,c)] == OP_NONE && q[NC(n,c)] != 0 ->
        if
        :: !hk[NC(n,c)] -> op[NC(n,c)] = OP_LOAD
        :: else -> form(n, c)
        fi
    :: else -> skip
    fi
}

/* A stopped or passivated core: its next send builds a new one
 * (actor.Conversations.StopConversations, the idle sweep). */
#define IDLE(n,c) (op[NC(n,c)] == OP_NONE && q[NC(n,c)] == 0 && bt[NC(n,c)] == 0)
inline reset_idle(n, c) {
    if
    :: IDLE(n,c) -> hk[NC(n,c)] = 0; hd[NC(n,c)] = 0; memo[NC(n,c)] = 0
    :: else -> skip
    fi
}

/* ownership.Core.stepDown: drop every partition (Fence refuses from now
 * on); cluster.Node.stepDown stops the idle conversations and releases the
 * leases, best effort (both branches: the release may fail). */
inline step_down(n, rel) {
    if
    :: rel -> wt = 0;
       do
       :: wt < C ->
           if
           :: HELD(n,wt) && lown[wt] == OWNER(n) && lep[wt] == hep[NC(n,wt)] -> lown[wt] = 0
           :: else -> skip
           fi;
           wt++
       :: else -> break
       od;
       wt = 0
    :: else -> skip
    fi;
    held[n] = 0; moving[n] = 0; fencedT[n] = 0;
    wt = 0;
    do
    :: wt < C -> hep[NC(n,wt)] = 0; hgen[NC(n,wt)] = 0; reset_idle(n, wt); wt++
    :: else -> break
    od;
    wt = 0;
    phase[n] = DOWN
}

/* ================= actions ================= */

/* cluster.Node.join -> membership.Store.Join (takeOver=false): a new
 * incarnation; refused while a live row of this node id exists. */
inline a_join(n) {
    d_step { phase[n] == NEW && minc[n] == 0 && inc[n] < MAXINC ->
#ifdef MUT_SAMEINC
        if :: inc[n] == 0 -> inc[n]++ :: else -> skip fi;   /* mutant: a restart joins under its old incarnation */
#else
        inc[n]++;
#endif
        minc[n] = inc[n]; phase[n] = ACTIVE }
}

/* membership.Store.Heartbeat (another node's, or the database clock): the
 * member row of node n expired and is removed. A node may be paused, cut off
 * or slow: any row may expire at any moment. */
inline a_expire(n) {
    d_step { minc[n] != 0 -> minc[n] = 0 }
}

/* ownership.Decide's Lost: a held partition shows a newer epoch in the view */
#if C == 1
#define LOST(n) (HELD(n,0) && lep[0] > hep[NC(n,0)])
#else
#define LOST(n) ((HELD(n,0) && lep[0] > hep[NC(n,0)]) || (HELD(n,1) && lep[1] > hep[NC(n,1)]))
#endif

/* cluster.Node.reconcile -> ownership.Core.Next: step down when in trouble
 * (cluster.Node.beat: Heartbeat answered ErrMemberGone -> Core.RenewFailed;
 * Core.Refused: TroubleFenced; Decide: Lost, the view shows a newer epoch). */
inline a_step_down(n, rel) {
    d_step { phase[n] == ACTIVE &&
        (minc[n] != inc[n] || fencedT[n] ||
         LOST(n)) ->
        step_down(n, rel) }
}

/* cluster.Node.rejoin: Remove the old row, Join as a new incarnation. The
 * process and its conversation actors live on. */
inline a_rejoin(n) {
    d_step { phase[n] == DOWN && inc[n] < MAXINC && reinc < MAXREINC ->
        reinc++; minc[n] = 0; inc[n]++; minc[n] = inc[n]; phase[n] = ACTIVE }
}

/* A crash (kill -9) and restart: memory is lost; a transaction in flight
 * stays with its backend and may still land (orphan); its senders never get
 * an answer. The new process joins once the old row expired (a_join). */
inline a_crash(n) {
    d_step { phase[n] != NEW && inc[n] < MAXINC && reinc < MAXREINC ->
        reinc++;
        phase[n] = NEW; held[n] = 0; moving[n] = 0; fencedT[n] = 0;
        wt = 0;
        do
        :: wt < C ->
            hep[NC(n,wt)] = 0; hgen[NC(n,wt)] = 0;
            op[NC(n,wt)] = OP_NONE; hk[NC(n,wt)] = 0; hd[NC(n,wt)] = 0; q[NC(n,wt)] = 0; bt[NC(n,wt)] = 0;
            bprev[NC(n,wt)] = 0; memo[NC(n,wt)] = 0; rmatch[NC(n,wt)] = 0;
            if
            :: tx[NC(n,wt)] == TX_PENDING -> orphan[NC(n,wt)] = 1
            :: else -> TX_FREE(n,wt)
            fi;
            wt++
        :: else -> break
        od;
        wt = 0;
        wi = 0;
        do
        :: wi < M ->
            if
            :: cw[wi] == n+1 -> cw[wi] = 0; unk[wi] = 1
            :: else -> skip
            fi;
            wi++
        :: else -> break
        od;
        wi = 0 }
}

/* cluster.Node.acquire -> membership.Store.Acquire (postgres
 * ClusterStore.Acquire): take partition p if its lease is free, ours, or
 * held by an incarnation that is not a live member; bump the epoch. Then
 * stopConvs (idle actors of p are dropped) and ownership.Core.Acquired;
 * or the answer is lost (timeout) and the node does not know it holds p. */
inline a_acquire(n, p, rec) {
    d_step { phase[n] == ACTIVE && !HELD(n,p) && minc[n] == inc[n] && gen[p] < MAXGEN &&
#ifdef MUT_NOLIVE
        1 ->     /* mutant: a lease is taken from a live owner */
#else
        (lown[p] == 0 || lown[p] == OWNER(n) || minc[ONODE(lown[p])] != OINC(lown[p])) ->
#endif
#ifdef MUT_KEEPOWN
        if :: lown[p] != OWNER(n) -> lep[p]++ :: else -> skip fi;   /* mutant: a lease already ours keeps its epoch */
        lown[p] = OWNER(n);
#elif defined(MUT_NOBUMP)
        lown[p] = OWNER(n);
        if :: lep[p] == 0 -> lep[p] = 1 :: else -> skip fi;   /* mutant: the epoch is not bumped */
#else
        lown[p] = OWNER(n);
        lep[p]++;
#endif
        gen[p]++;
        if
        :: rec -> reset_idle(n, p);
           held[n] = held[n] | BIT(p); hep[NC(n,p)] = lep[p]; hgen[NC(n,p)] = gen[p]
        :: else -> skip
        fi }
}

/* ownership.Core.StartHandoff (the ring moved p, or Leave): no new fences. */
inline a_handoff_start(n, p) {
    d_step { phase[n] == ACTIVE && HELD(n,p) && !MOVING(n,p) -> moving[n] = moving[n] | BIT(p) }
}

/* cluster.Node.release: stopConvs (bounded by StopTimeout: a busy actor may
 * outlive it), membership.Store.Release (only if still held at that owner
 * and epoch; the epoch is kept), ownership.Core.Released. */
inline a_handoff_release(n, p) {
    d_step { MOVING(n,p) ->
        reset_idle(n, p);
        if
        :: lown[p] == OWNER(n) && lep[p] == hep[NC(n,p)] -> lown[p] = 0
        :: else -> skip
        fi;
        held[n] = held[n] & ~BIT(p); moving[n] = moving[n] & ~BIT(p);
        hep[NC(n,p)] = 0; hgen[NC(n,p)] = 0 }
}

/* A client sends (or resends, same key) message m to node n: api Send ->
 * cluster.Node.send -> ownership.Core.Route. Local when n holds the
 * partition and it is not moving: actor -> conv.Core.Send (memo, pending
 * entry, or a new queued entry). Otherwise the node waits HandoffWait or
 * forwards (a forward is a resend to another node, which the client's
 * choice of n covers) and answers a retryable error. */
inline a_send(m, n) {
    d_step { cw[m] == 0 && !acked[m] && (!sent[m] || resends < MAXRESEND) ->
        if :: sent[m] -> resends++ :: else -> sent[m] = 1 fi;
        cw[m] = n+1; errf[m] = 0;
        if
        :: phase[n] == ACTIVE && !fencedT[n] && HELD(n, MCONV(m)) && !MOVING(n, MCONV(m)) ->
            if
#ifndef MUT_NODEDUP
            :: memo[NC(n,MCONV(m))] & BIT(m) -> answer_ack(n, m, landedSeq[m])
            :: !(memo[NC(n,MCONV(m))] & BIT(m)) && ((q[NC(n,MCONV(m))] | bt[NC(n,MCONV(m))]) & BIT(m)) ->
                skip   /* attached to the entry queued or in flight */
            :: !(memo[NC(n,MCONV(m))] & BIT(m)) && !((q[NC(n,MCONV(m))] | bt[NC(n,MCONV(m))]) & BIT(m)) ->
#else
            :: (q[NC(n,MCONV(m))] | bt[NC(n,MCONV(m))]) & BIT(m) -> skip
            :: !((q[NC(n,MCONV(m))] | bt[NC(n,MCONV(m))]) & BIT(m)) ->
#endif
                q[NC(n,MCONV(m))] = q[NC(n,MCONV(m))] | BIT(m);
                advance(n, MCONV(m))
            fi
        :: else -> answer_err(n, m)
        fi }
}

/* The client's deadline passes: the outcome of its attempt is unknown to it;
 * the entry (if any) goes on without it. */
inline a_give_up(m) {
    d_step { cw[m] != 0 -> cw[m] = 0; unk[m] = 1 }
}

/* actor convActor.execute, LoadHead: persist.Store.LoadHead, then
 * conv.Core.HeadLoaded adopts it and advances (forms a batch). One step:
 * a head that turns stale comes from a writer that outlived a handoff busy
 * (a lookup or a resolve in flight), which the model keeps. */
inline a_load(n, c) {
    d_step { op[NC(n,c)] == OP_LOAD -> hd[NC(n,c)] = head[c]; hk[NC(n,c)] = 1; op[NC(n,c)] = OP_NONE; advance(n, c) }
}

/* The store's answer reaches the writer (in the step that ran the
 * transaction: a delayed answer is a lost one, a_unknown): commit.Writer -> actor commitDone
 * (a StaleFenceError goes to cluster.Node.Refused -> ownership.Core.Refused
 * first) -> conv.Core.Committed, with persist.OutcomeOf's meaning. */
inline committed(n, c) {
        op[NC(n,c)] = OP_NONE;
        if
        :: tx[NC(n,c)] == TX_OK ->
#ifdef MUT_EARLYACK
            skip
#else
            land(n, c, bprev[NC(n,c)] + BTLEN(n,c))
#endif
        :: tx[NC(n,c)] == TX_STALE ->
            if   /* ownership.Core.Refused */
            :: phase[n] == ACTIVE && txfo[NC(n,c)] == OWNER(n) && HELD(n,c) && hep[NC(n,c)] == txfe[NC(n,c)] ->
                fencedT[n] = 1
            :: else -> skip
            fi;
            FORGET_HEAD(n,c); fail_mask(n, bt[NC(n,c)]); BATCH_DONE(n,c)
        :: tx[NC(n,c)] == TX_MISMATCH || tx[NC(n,c)] == TX_CONFSEQ ->
            FORGET_HEAD(n,c); fail_mask(n, bt[NC(n,c)]); BATCH_DONE(n,c)
        :: tx[NC(n,c)] == TX_CONFKEY -> op[NC(n,c)] = OP_LOOKUP       /* conv.Core.onConflict */
        :: tx[NC(n,c)] == TX_ABORTED -> fail_mask(n, bt[NC(n,c)]); BATCH_DONE(n,c)   /* NotLanded */
        fi;
        TX_FREE(n,c);
        advance(n, c)
}

/* The server runs the transaction of slot (n,c): postgres.Store.commitOn's
 * pipeline BEGIN; fenceCheckSQL (partition_lease FOR SHARE); headCheckSQL
 * (compare-and-set); insertSQL (uk_from_client, uk_conv_seq); COMMIT.
 * Atomic: the row locks serialize it with Acquire, Release and other
 * commits of the conversation. HEAD_FENCE: the Citus commit instead. */
inline a_tx_run(n, c) {
    d_step { tx[NC(n,c)] == TX_PENDING ->
        wo = TX_OK;
#ifdef HEAD_FENCE
        if
# ifndef MUT_NOEPOCHCMP
        :: hepr[c] > txfe[NC(n,c)] -> wo = TX_STALE
# endif
        :: head[c] != txprev[NC(n,c)] -> wo = TX_MISMATCH
        :: else -> skip
        fi;
#else
        if
# ifndef MUT_NOFENCE
        :: lown[c] != txfo[NC(n,c)] || lep[c] != txfe[NC(n,c)] -> wo = TX_STALE
# endif
# ifndef MUT_NOCAS
        :: head[c] != txprev[NC(n,c)] -> wo = TX_MISMATCH
# endif
        :: else -> skip
        fi;
#endif
        /* unique keys */
        wi = 0; wk = 0;
        do
        :: wi < M && wo == TX_OK ->
            if
            :: txbt[NC(n,c)] & BIT(wi) ->
                wk++;
#ifndef MUT_NODEDUP
                if :: STORED_NOW(wi) -> wo = TX_CONFKEY :: else -> skip fi;
#endif
                if
                :: txbase[NC(n,c)] + wk > MAXS -> assert(bounds)
                :: else -> skip
                fi;
                if :: wo == TX_OK && ROW(c, txbase[NC(n,c)] + wk) != 0 -> wo = TX_CONFSEQ :: else -> skip fi
            :: else -> skip
            fi;
            wi++
        :: else -> break
        od;
        if
        :: wo == TX_STALE ->
            wt = ONODE(txfo[NC(n,c)]);
            assert(live_holder || !(minc[wt] == OINC(txfo[NC(n,c)]) && inc[wt] == OINC(txfo[NC(n,c)]) &&
                phase[wt] == ACTIVE && HELD(wt,c) && !MOVING(wt,c) && hep[NC(wt,c)] == txfe[NC(n,c)]));
            wt = 0
        :: wo == TX_OK ->
            /* write the rows at txbase+1.. */
            wi = 0; wk = 0;
            do
            :: wi < M ->
                if
                :: txbt[NC(n,c)] & BIT(wi) ->
                    wk++; ws = txbase[NC(n,c)] + wk;
                    assert(one_per_seq || !(seqw[c] & BIT(ws)));
                    seqw[c] = seqw[c] | BIT(ws);
                    ROW(c, ws) = wi+1;
                    assert(stored_once || !(everStored & BIT(wi)));
                    assert(err_final || !errf[wi]);
                    everStored = everStored | BIT(wi); landedSeq[wi] = ws
                :: else -> skip
                fi;
                wi++
            :: else -> break
            od;
            assert(never_back || txbase[NC(n,c)] + wk >= head[c]);
            head[c] = txbase[NC(n,c)] + wk;
#ifdef LASTG
            assert(one_writer || txgen[NC(n,c)] >= lastg[c]);
            lastg[c] = txgen[NC(n,c)];
#endif
#ifdef HEAD_FENCE
            hepr[c] = txfe[NC(n,c)];
#else
            assert(fenced || txgen[NC(n,c)] == gen[c]);
#endif
            check_contiguous(c)
        :: else -> skip
        fi;
        wi = 0; wk = 0; ws = 0;
        if
        :: orphan[NC(n,c)] || op[NC(n,c)] != OP_COMMIT ->
            orphan[NC(n,c)] = 0; TX_FREE(n,c); wo = 0   /* nobody listens: settled by Settle's re-read */
        :: else -> tx[NC(n,c)] = wo; wo = 0; committed(n, c)
        fi }
}

/* The transaction never runs or is rolled back (connection lost before
 * COMMIT, the server restarted, reapBlockers or Settle terminated it). */
inline a_tx_abort(n, c) {
    d_step { tx[NC(n,c)] == TX_PENDING ->
        if
        :: orphan[NC(n,c)] || op[NC(n,c)] != OP_COMMIT -> orphan[NC(n,c)] = 0; TX_FREE(n,c)
        :: else -> tx[NC(n,c)] = TX_ABORTED; committed(n, c)
        fi }
}

/* The writer is told ErrUnknownOutcome (connection lost after COMMIT went
 * out, commit.Writer's timeout): conv.Core.Committed -> resolve; the
 * senders wait. The transaction may still be pending on the server. */
inline a_unknown(n, c) {
    d_step { op[NC(n,c)] == OP_COMMIT && tx[NC(n,c)] != TX_NONE ->
#ifdef MUT_UNKNOWN_AS_FAILED
        /* mutant: persist.OutcomeOf says "not landed" for an unknown outcome */
        op[NC(n,c)] = OP_NONE; FORGET_HEAD(n,c); fail_mask(n, bt[NC(n,c)]); BATCH_DONE(n,c);
        orphan[NC(n,c)] = (tx[NC(n,c)] == TX_PENDING);
        if :: tx[NC(n,c)] != TX_PENDING -> TX_FREE(n,c) :: else -> skip fi;
        advance(n, c)
#else
        FORGET_HEAD(n,c); op[NC(n,c)] = OP_RESOLVE
#endif
    }
}

/* actor convActor.execute, Resolve: persist.Store.Settle (postgres
 * Store.Settle: terminate the backend, wait until it is gone), then
 * LoadHead and ReadRange(PrevHead, len). */
inline a_resolve_read(n, c) {
    d_step { op[NC(n,c)] == OP_RESOLVE ->
#ifdef MUT_NOSETTLE
        /* mutant: re-read without settling; the old transaction may land later */
        orphan[NC(n,c)] = (tx[NC(n,c)] == TX_PENDING);
        if :: tx[NC(n,c)] != TX_PENDING -> TX_FREE(n,c) :: else -> skip fi;
#else
        TX_FREE(n,c);     /* a pending one is terminated: rolled back */
#endif
        hd[NC(n,c)] = head[c];
        /* do the rows after PrevHead carry the batch? */
        rmatch[NC(n,c)] = 1; wi = 0; wk = 0;
        do
        :: wi < M ->
            if
            :: bt[NC(n,c)] & BIT(wi) -> wk++;
                if :: ROW(c, bprev[NC(n,c)] + wk) != wi+1 -> rmatch[NC(n,c)] = 0 :: else -> skip fi
            :: else -> skip
            fi;
            wi++
        :: else -> break
        od;
        wi = 0; wk = 0;
        op[NC(n,c)] = OP_RESOLVED }
}

/* conv.Core.Resolved: landed (head >= LastSeq and the rows are ours): ack;
 * else adopt the stored head and fail the batch (it consumed no seq). */
inline a_resolved(n, c) {
    d_step { op[NC(n,c)] == OP_RESOLVED ->
        op[NC(n,c)] = OP_NONE;
        if
        :: rmatch[NC(n,c)] && hd[NC(n,c)] >= bprev[NC(n,c)] + BTLEN(n,c) -> land(n, c, hd[NC(n,c)])
        :: else -> hk[NC(n,c)] = 1; fail_mask(n, bt[NC(n,c)]); BATCH_DONE(n,c)
        fi;
        rmatch[NC(n,c)] = 0;
        advance(n, c) }
}

/* conv.Core.LookedUp: persist.Store.FindByClientKey for the keys that hit
 * uk_from_client: stored in this conversation -> the first send's seq
 * (duplicate); not found -> queued again. */
inline a_looked_up(n, c) {
    d_step { op[NC(n,c)] == OP_LOOKUP ->
        wi = 0;
        do
        :: wi < M ->
            if
            :: (bt[NC(n,c)] & BIT(wi)) && STORED_NOW(wi) ->
                memo[NC(n,c)] = memo[NC(n,c)] | BIT(wi); answer_ack(n, wi, landedSeq[wi])
            :: (bt[NC(n,c)] & BIT(wi)) && !STORED_NOW(wi) -> q[NC(n,c)] = q[NC(n,c)] | BIT(wi)
            :: else -> skip
            fi;
            wi++
        :: else -> break
        od;
        wi = 0;
        BATCH_DONE(n,c); op[NC(n,c)] = OP_NONE;
        advance(n, c) }
}

/* A writer whose form waited for its transaction slot (a crashed
 * predecessor's orphan) forms once the slot is free. */
inline a_advance(n, c) {
    d_step { op[NC(n,c)] == OP_NONE && q[NC(n,c)] != 0 && tx[NC(n,c)] == TX_NONE -> advance(n, c) }
}

/* The idle sweep passivates an idle actor (actor convActor idleCheckMsg):
 * its head and memo are gone; the next send reloads from the store. */
inline a_passivate(n, c) {
    d_step { IDLE(n,c) && hk[NC(n,c)] -> hk[NC(n,c)] = 0; hd[NC(n,c)] = 0; memo[NC(n,c)] = 0 }
}

/* Retention (persist.Store.TrimBefore): delete the oldest row of c. Only
 * rows whose sends are settled: acked (its client resends no more), no entry or
 * transaction holding the key (a resend after its row was trimmed is
 * stored again: retention forgets keys, by design). */
inline a_trim(c) {
    d_step { trimmed[c] < head[c] && ROW(c, trimmed[c]+1) != 0 &&
        acked[ROW(c, trimmed[c]+1)-1] &&
        cw[ROW(c, trimmed[c]+1)-1] == 0 && !inflight(ROW(c, trimmed[c]+1)-1) ->
        ROW(c, trimmed[c]+1) = 0; trimmed[c]++;
        check_contiguous(c) }
}

/* ================= node symmetry ================= */

/* Nodes are interchangeable: every action exists for every node, no
 * invariant names one, and the bounds are per node. So a state and the same
 * state with two nodes' names swapped have the same futures up to that
 * renaming, and the same invariants hold in both. After every action, canon
 * sorts the nodes by their own state (a fixed order of their fields) and
 * renames every reference to them (lease owners, fence owners, the node a
 * client waits at): the checker then stores one state for all the orders of
 * the nodes, up to N! fewer states, and the search stays exhaustive. Nodes
 * whose own fields are equal are not sorted further (a choice that only costs
 * reduction, never soundness: any renaming of a state is a state of the same
 * system). -DNOSYM turns it off. In a trail (spin -t -p) a swap prints
 * "canon: nodes a and b renamed"; node numbers after it are the new ones. */
#ifndef NOSYM
hidden byte wa, wb, wc, wu, wx;  /* scratch of canon */

#define SWAPV(x, y) wu = x; x = y; y = wu
/* an owner value (OWNER encoding) naming node a or b names the other */
#define RENAME_OWNER(v) if \
    :: (v) != 0 && ONODE(v) == wa -> v = wb*4 + OINC(v) \
    :: (v) != 0 && ONODE(v) == wb -> v = wa*4 + OINC(v) \
    :: else -> skip \
    fi

/* rename nodes wa <-> wb everywhere */
inline swap_nodes() {
    printf("canon: nodes %d and %d renamed\n", wa, wb);
    SWAPV(minc[wa], minc[wb]); SWAPV(phase[wa], phase[wb]); SWAPV(inc[wa], inc[wb]);
    SWAPV(held[wa], held[wb]); SWAPV(moving[wa], moving[wb]); SWAPV(fencedT[wa], fencedT[wb]);
    wx = 0;
    do
    :: wx < C ->
        SWAPV(hep[NC(wa,wx)], hep[NC(wb,wx)]); SWAPV(hgen[NC(wa,wx)], hgen[NC(wb,wx)]);
        SWAPV(op[NC(wa,wx)], op[NC(wb,wx)]); SWAPV(hk[NC(wa,wx)], hk[NC(wb,wx)]);
        SWAPV(hd[NC(wa,wx)], hd[NC(wb,wx)]); SWAPV(q[NC(wa,wx)], q[NC(wb,wx)]);
        SWAPV(bt[NC(wa,wx)], bt[NC(wb,wx)]); SWAPV(bprev[NC(wa,wx)], bprev[NC(wb,wx)]);
        SWAPV(memo[NC(wa,wx)], memo[NC(wb,wx)]); SWAPV(rmatch[NC(wa,wx)], rmatch[NC(wb,wx)]);
        SWAPV(tx[NC(wa,wx)], tx[NC(wb,wx)]); SWAPV(txbt[NC(wa,wx)], txbt[NC(wb,wx)]);
        SWAPV(txprev[NC(wa,wx)], txprev[NC(wb,wx)]); SWAPV(txbase[NC(wa,wx)], txbase[NC(wb,wx)]);
        SWAPV(txfo[NC(wa,wx)], txfo[NC(wb,wx)]); SWAPV(txfe[NC(wa,wx)], txfe[NC(wb,wx)]);
        SWAPV(txgen[NC(wa,wx)], txgen[NC(wb,wx)]); SWAPV(orphan[NC(wa,wx)], orphan[NC(wb,wx)]);
        RENAME_OWNER(lown[wx]);
        wx++
    :: else -> break
    od;
    wx = 0;
    do
    :: wx < N*C -> RENAME_OWNER(txfo[wx]); wx++
    :: else -> break
    od;
    wx = 0;
    do
    :: wx < M ->
        if
        :: cw[wx] == wa+1 -> cw[wx] = wb+1
        :: cw[wx] == wb+1 -> cw[wx] = wa+1
        :: else -> skip
        fi;
        wx++
    :: else -> break
    od;
    wx = 0; wu = 0
}

/* wc := 1 if node wa's own fields come before node wb's, 2 if after, 0 if
 * equal (fields that name nodes compare only what they say about the node
 * itself: the incarnation of a fence owner, whether it is the node). */
#define CMPF(x, y) if :: wc == 0 && (x) < (y) -> wc = 1 :: wc == 0 && (x) > (y) -> wc = 2 :: else -> skip fi
#define SELF(v, n) ((v) != 0 && ONODE(v) == (n))
inline cmp_nodes() {
    wc = 0;
    CMPF(phase[wa], phase[wb]); CMPF(inc[wa], inc[wb]); CMPF(minc[wa], minc[wb]);
    CMPF(held[wa], held[wb]); CMPF(moving[wa], moving[wb]); CMPF(fencedT[wa], fencedT[wb]);
    wx = 0;
    do
    :: wx < C && wc == 0 ->
        CMPF(hep[NC(wa,wx)], hep[NC(wb,wx)]); CMPF(op[NC(wa,wx)], op[NC(wb,wx)]);
        CMPF(hk[NC(wa,wx)], hk[NC(wb,wx)]); CMPF(hd[NC(wa,wx)], hd[NC(wb,wx)]);
        CMPF(q[NC(wa,wx)], q[NC(wb,wx)]); CMPF(bt[NC(wa,wx)], bt[NC(wb,wx)]);
        CMPF(bprev[NC(wa,wx)], bprev[NC(wb,wx)]); CMPF(memo[NC(wa,wx)], memo[NC(wb,wx)]);
        CMPF(rmatch[NC(wa,wx)], rmatch[NC(wb,wx)]); CMPF(tx[NC(wa,wx)], tx[NC(wb,wx)]);
        CMPF(txbt[NC(wa,wx)], txbt[NC(wb,wx)]); CMPF(txprev[NC(wa,wx)], txprev[NC(wb,wx)]);
        CMPF(txbase[NC(wa,wx)], txbase[NC(wb,wx)]); CMPF(txfe[NC(wa,wx)], txfe[NC(wb,wx)]);
        CMPF(OINC(txfo[NC(wa,wx)]), OINC(txfo[NC(wb,wx)]));
        CMPF(SELF(txfo[NC(wa,wx)], wa), SELF(txfo[NC(wb,wx)], wb));
        CMPF(orphan[NC(wa,wx)], orphan[NC(wb,wx)]);
        CMPF(SELF(lown[wx], wa), SELF(lown[wx], wb));
        CMPF(hgen[NC(wa,wx)], hgen[NC(wb,wx)]); CMPF(txgen[NC(wa,wx)], txgen[NC(wb,wx)]);
        wx++
    :: else -> break
    od;
    wx = 0;
    do
    :: wx < M && wc == 0 -> CMPF(cw[wx] == wa+1, cw[wx] == wb+1); wx++
    :: else -> break
    od;
    wx = 0
}

/* compare-and-swap nodes x < y */
inline order(x, y) {
    wa = x; wb = y; cmp_nodes();
    if
    :: wc == 2 -> swap_nodes()
    :: else -> skip
    fi;
    wa = 0; wb = 0; wc = 0
}

inline canon() {
#if N == 3
    order(0, 1); order(1, 2); order(0, 1)
#else
    order(0, 1)
#endif
}
#define CANON canon()
#else
#define CANON skip
#endif

/* ================= the system ================= */

/* the two outcomes of a step-down's release and of an acquire's answer */
#define a_step_down_rel(n) a_step_down(n, 1)
#define a_step_down_norel(n) a_step_down(n, 0)
#define a_acquire_rec(n, p) a_acquire(n, p, 1)
#define a_acquire_lost(n, p) a_acquire(n, p, 0)

#if N == 3
#define FOR_N(A) :: A(0) :: A(1) :: A(2)
#else
#define FOR_N(A) :: A(0) :: A(1)
#endif
#if C == 1
#define FOR_C(A) :: A(0)
#define FOR_NC_N(A, n) :: A(n, 0)
#else
#define FOR_C(A) :: A(0) :: A(1)
#define FOR_NC_N(A, n) :: A(n, 0) :: A(n, 1)
#endif
#if N == 3
#define FOR_NC(A) FOR_NC_N(A, 0) FOR_NC_N(A, 1) FOR_NC_N(A, 2)
#define FOR_MN_M(A, m) :: A(m, 0) :: A(m, 1) :: A(m, 2)
#else
#define FOR_NC(A) FOR_NC_N(A, 0) FOR_NC_N(A, 1)
#define FOR_MN_M(A, m) :: A(m, 0) :: A(m, 1)
#endif
#if M == 3
#define FOR_M(A) :: A(0) :: A(1) :: A(2)
#define FOR_MN(A) FOR_MN_M(A, 0) FOR_MN_M(A, 1) FOR_MN_M(A, 2)
#else
#define FOR_M(A) :: A(0) :: A(1)
#define FOR_MN(A) FOR_MN_M(A, 0) FOR_MN_M(A, 1)
#endif

/* One step of the system: one action (each is a d_step), then canon; the
 * state between the two is not stored (atomic). */
active proctype system() {
end:
    do
    :: atomic {
    if
    FOR_N(a_join)
    FOR_N(a_expire)
    FOR_N(a_step_down_rel)
#ifdef FULL
    FOR_N(a_step_down_norel)
#endif
    FOR_N(a_rejoin)
#ifndef NOCRASH
    FOR_N(a_crash)
#endif
    FOR_NC(a_acquire_rec)
#ifdef FULL
    FOR_NC(a_acquire_lost)
#endif
    FOR_NC(a_handoff_start)
    FOR_NC(a_handoff_release)
    FOR_MN(a_send)
    FOR_M(a_give_up)
    FOR_NC(a_load)
    FOR_NC(a_tx_run)
    FOR_NC(a_tx_abort)
    FOR_NC(a_unknown)
    FOR_NC(a_resolve_read)
    FOR_NC(a_resolved)
    FOR_NC(a_looked_up)
    FOR_NC(a_passivate)
    FOR_NC(a_advance)
#ifdef RETENTION
    FOR_C(a_trim)
#endif
    fi;
    d_step { CANON }
    }
    od
}
