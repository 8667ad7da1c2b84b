#!/usr/bin/env bash
# model/check.sh: check the ownership protocol's model (ownership.pml) with
# spin, exhaustively, in both fencing variants (PostgreSQL's lease fence and
# the Citus head fence, -DHEAD_FENCE) and at several bounds (crash and
# restart, 3 nodes, 3 messages, 2 conversations), then every mutant in
# mutants/, each of which must be rejected by the invariant its EXPECT line
# names.
# Fails if the model shows an error or an incomplete search, or if a mutant
# passes. docs/TESTING.md ("The model") explains the bounds and the mutants.
#
#   model/check.sh                 the CI runs (below)
#   MODEL_BOUNDS='-DN=3 ...' model/check.sh   both variants and the mutants at these bounds
#   model/check.sh mutants/nofence.pml   one file (a mutant, or the model) at the
#                                        mutants' bounds (or MODEL_BOUNDS)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v spin >/dev/null || { echo "model: spin is missing (apt-get install -y spin)"; exit 1; }
command -v gcc >/dev/null || { echo "model: gcc is missing"; exit 1; }

# The CI runs: name and bounds (docs/TESTING.md, "Bounds"). Each bound set
# is as large as fits: together they take about a minute on two idle cores.
#   postgres, headfence: 2 nodes, crash and restart or rejoin (2 incarnations
#     per node), a lost Acquire answer and a failed release (-DFULL), one
#     resend, retention;
#   3nodes: 3 nodes, one crash or rejoin in all, no resend;
#   3nodes-resend: 3 nodes, one resend, no crash or rejoin;
#   3msgs: 3 messages, no resend, no crash or rejoin;
#   2convs: 2 partitions with one conversation and one message each.
COMMON='-DMAXGEN=2 -DRETENTION'
RUNS=(
  "model-headfence|-DN=2 -DC=1 -DM=2 -DMAXINC=2 -DMAXRESEND=1 -DFULL -DHEAD_FENCE $COMMON"
  "model-postgres|-DN=2 -DC=1 -DM=2 -DMAXINC=2 -DMAXRESEND=1 -DFULL $COMMON"
  "model-3nodes-resend|-DN=3 -DC=1 -DM=2 -DMAXINC=1 -DMAXRESEND=1 -DFULL $COMMON"
  "model-3msgs|-DN=2 -DC=1 -DM=3 -DMAXINC=1 -DMAXRESEND=0 -DFULL $COMMON"
  "model-3nodes|-DN=3 -DC=1 -DM=2 -DMAXINC=2 -DMAXREINC=1 -DMAXRESEND=0 -DFULL $COMMON"
  "model-2convs|-DN=2 -DC=2 -DM=2 -DMAXINC=1 -DMAXRESEND=0 $COMMON"
)
# The mutants' bounds (a mutant's BOUNDS line adds to them): small, so that
# each violation is found in a second or two; no crash unless a mutant asks.
MUTANT_BOUNDS='-DN=2 -DC=1 -DM=2 -DMAXINC=1 -DMAXGEN=2 -DMAXRESEND=1 -DNOCRASH'
if [ -n "${MODEL_BOUNDS:-}" ]; then
  RUNS=("model-postgres|$MODEL_BOUNDS -DRETENTION" "model-headfence|$MODEL_BOUNDS -DRETENTION -DHEAD_FENCE")
  MUTANT_BOUNDS=$MODEL_BOUNDS
fi
DEPTH=${MODEL_DEPTH:-100000}
HASH=${MODEL_HASH:-24}     # 2^24 slots (128 MB)
JOBS=${MODEL_JOBS:-2}      # runs at once (the machine has 2 cores)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
start_all=$(date +%s.%N)

# run NAME FILE EXPECT FLAGS...: EXPECT is "" for the model (no error
# allowed) or the name of the invariant that must be violated.
run() {
  local name=$1 file=$2 expect=$3; shift 3
  local dir="$work/$name" t0 t1 out states depth result
  mkdir -p "$dir"
  t0=$(date +%s.%N)
  local TIMEFORMAT='%U %S'   # CPU seconds (user, system) of spin, gcc and pan
  { time ( cd "$dir" && spin "$@" -a "$file" >spin.log 2>&1 && gcc ${MODEL_CFLAGS:-$OPT} ${MUT_CFLAGS:-} -DSAFETY -o pan pan.c >gcc.log 2>&1 ) ; } 2>"$dir/cpu.build" || {
    echo "model: $name: spin or gcc failed:"; cat "$dir/spin.log" "$dir/gcc.log" 2>/dev/null | head -20; touch "$work/failed"; return; }
  { time ( cd "$dir" && ./pan -m"$DEPTH" -w"$HASH" >pan.log 2>&1 ) ; } 2>"$dir/cpu.pan" || true
  t1=$(date +%s.%N)
  local cpu
  cpu=$(cat "$dir/cpu.build" "$dir/cpu.pan" | awk '{s += $1 + $2} END {printf "%.1f", s}')
  out="$dir/pan.log"
  states=$(awk '/states, stored/ {print $1; exit}' "$out")
  depth=$(awk -F'depth reached ' '/depth reached/ {split($2, a, ","); print a[1]; exit}' "$out")
  local errors
  errors=$(awk -F'errors: ' '/errors:/ {print $2+0; exit}' "$out")
  if grep -q 'max search depth too small' "$out"; then
    result="FAIL (search depth too small: raise MODEL_DEPTH)"; fail=1
  elif [ -z "$expect" ]; then
    if [ "${errors:-1}" = 0 ] && grep -q 'Full statespace search' "$out" && ! grep -q 'Search not completed' "$out"; then
      result="ok: no violation, exhaustive"
    else
      result="FAIL: $(grep -m1 -E 'assertion violated|invalid end state|error' "$out" || echo 'incomplete search')"; fail=1
      ( cd "$dir" && spin -t -k "$(basename "$file").trail" -p "$@" "$file" 2>&1 | tail -60 ) || true
    fi
  else
    local v
    v=$(grep -m1 'assertion violated' "$out" || true)
    if [ -n "$v" ] && echo "$v" | grep -q "($expect||"; then
      result="ok: rejected by $expect"
    elif [ -n "$v" ]; then
      result="FAIL: rejected by another invariant than $expect: $v"; fail=1
    else
      result="FAIL: NOT rejected (the mutant passes)"; fail=1
    fi
  fi
  printf '%-28s states %10s  depth %4s  %6.1fs (cpu %5ss)  %s\n' "$name" "${states:-?}" "${depth:-?}" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$cpu" "$result"
  [ "$fail" = 0 ] || touch "$work/failed"
}

# spawn ARGS...: run in the background, at most JOBS at once; each run's
# report is printed in order at the end.
n=0
spawn() {
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  n=$((n+1))
  run "$@" >"$work/report.$(printf %03d $n)" 2>&1 &
}

# bounds_of FILE: a mutant's own extra flags (its BOUNDS: line).
bounds_of() { sed -n 's/^.*BOUNDS://p' "$1" | head -1; }
# cflags_of FILE: a mutant's pan compile flags (its CFLAGS: line), e.g.
# -DT_REVERSE, a search order that reaches its violation sooner.
cflags_of() { sed -n 's/^.*CFLAGS://p' "$1" | head -1; }
expect_of() { sed -n 's/^.*EXPECT: *//p' "$1" | head -1 | tr -d ' '; }

echo "model: spin $(spin -V | awk '{print $3}'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ $# -gt 0 ]; then
  for f in "$@"; do
    f=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
    # shellcheck disable=SC2046,SC2086
    OPT=-O0 MUT_CFLAGS="$(cflags_of "$f")" spawn "$(basename "$f" .pml)" "$f" "$(expect_of "$f")" $MUTANT_BOUNDS $(bounds_of "$f")
  done
else
  # The large runs first (compiled with -O2: a third faster for a second
  # more of gcc), two at a time; the mutants fill in.
  for r in "${RUNS[@]}"; do
    echo "model: ${r%%|*}: ${r#*|}"
    # shellcheck disable=SC2086
    OPT=-O2 spawn "${r%%|*}" "$here/ownership.pml" "" ${r#*|}
  done
  echo "model: mutants: $MUTANT_BOUNDS"
  for f in "$here"/mutants/*.pml; do
    [ -n "$(expect_of "$f")" ] || { echo "model: $f has no EXPECT: line"; exit 1; }
    # shellcheck disable=SC2046,SC2086
    OPT=-O0 MUT_CFLAGS="$(cflags_of "$f")" spawn "mutant-$(basename "$f" .pml)" "$f" "$(expect_of "$f")" $MUTANT_BOUNDS $(bounds_of "$f")
  done
fi
wait
cat "$work"/report.*
[ -e "$work/failed" ] && fail=1
printf 'model: total %.1fs\n' "$(awk -v a="$start_all" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')"
if [ "$fail" != 0 ]; then
  echo "model: FAILED"
  exit 1
fi
echo "model: ok"
