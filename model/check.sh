#!/usr/bin/env bash
# model/check.sh: check the ownership protocol's model (ownership.pml) with
# spin, exhaustively, in both fencing variants (PostgreSQL's lease fence and
# the Citus head fence, -DHEAD_FENCE), then every mutant in mutants/, each of
# which must be rejected by the invariant its EXPECT line names.
# Fails if the model shows an error or an incomplete search, or if a mutant
# passes. docs/TESTING.md ("The model") explains the bounds and the mutants.
#
#   model/check.sh                 the CI bounds (MODEL_BOUNDS overrides them)
#   MODEL_BOUNDS='-DN=3 ...' model/check.sh
#   model/check.sh mutants/nofence.pml   one file (a mutant, or the model)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v spin >/dev/null || { echo "model: spin is missing (apt-get install -y spin)"; exit 1; }
command -v gcc >/dev/null || { echo "model: gcc is missing"; exit 1; }

# The CI bounds: 2 nodes, 1 partition/conversation, 2 messages, one resend,
# 1 incarnation per node, 2 lease acquisitions per partition (a mutant may
# raise them on its BOUNDS line; docs/TESTING.md has the larger runs).
BOUNDS=${MODEL_BOUNDS:--DN=2 -DC=1 -DM=2 -DMAXINC=1 -DMAXGEN=2 -DMAXRESEND=1 -DNOCRASH}
DEPTH=${MODEL_DEPTH:-100000}
HASH=${MODEL_HASH:-23}     # 2^23 slots
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
  ( cd "$dir" && spin "$@" -a "$file" >spin.log 2>&1 && gcc ${MODEL_CFLAGS:--O1} ${MUT_CFLAGS:-} -DSAFETY -o pan pan.c >gcc.log 2>&1 ) || {
    echo "model: $name: spin or gcc failed:"; cat "$dir/spin.log" "$dir/gcc.log" 2>/dev/null | head -20; touch "$work/failed"; return; }
  ( cd "$dir" && ./pan -m"$DEPTH" -w"$HASH" >pan.log 2>&1 ) || true
  t1=$(date +%s.%N)
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
  printf '%-28s states %10s  depth %5s  %6.1fs  %s\n' "$name" "${states:-?}" "${depth:-?}" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$result"
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

echo "model: spin $(spin -V | awk '{print $3}'), bounds: $BOUNDS"
if [ $# -gt 0 ]; then
  for f in "$@"; do
    f=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
    # shellcheck disable=SC2046,SC2086
    MUT_CFLAGS="$(cflags_of "$f")" spawn "$(basename "$f" .pml)" "$f" "$(expect_of "$f")" $BOUNDS $(bounds_of "$f")
  done
else
  # shellcheck disable=SC2086
  spawn model-postgres "$here/ownership.pml" "" $BOUNDS -DRETENTION
  # shellcheck disable=SC2086
  spawn model-headfence "$here/ownership.pml" "" $BOUNDS -DRETENTION -DHEAD_FENCE
  for f in "$here"/mutants/*.pml; do
    [ -n "$(expect_of "$f")" ] || { echo "model: $f has no EXPECT: line"; exit 1; }
    # shellcheck disable=SC2046,SC2086
    MUT_CFLAGS="$(cflags_of "$f")" spawn "mutant-$(basename "$f" .pml)" "$f" "$(expect_of "$f")" $BOUNDS $(bounds_of "$f")
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
