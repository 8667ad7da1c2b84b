#!/usr/bin/env bash
# make image-test: build the image, then run it for real.
#  1. One node on the local PostgreSQL (host network, a fresh database dropped
#     afterwards): sends, a duplicate, a pull, `sequencer health` inside the
#     container, then `podman stop` (SIGTERM): the log shows the drain and
#     "stopped cleanly", the exit code is 0, the rows are in the database.
#  2. One node on the embedded store in a named volume (written by the
#     non-root user 65532): sends, stop, start the same container again:
#     the conversation continues at head+1.
#  3. Three nodes in cluster mode on another fresh database (host network,
#     loopback addresses): every node takes sends for conversations another
#     node owns (forwarded); one node is stopped with SIGTERM (hands off, exit
#     0) and its conversations continue at head+1 on the others.
# Any failure exits non-zero; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
. scripts/podman-env.sh
command -v curl >/dev/null || { echo "installing curl"; (apt-get update -qq && apt-get install -y -qq curl) >/dev/null; }

PGHOST=${PGHOST:-127.0.0.1}
PGURL="postgres://postgres@$PGHOST:5432"
run_id="imgtest-$$-$RANDOM"
db="seq_${run_id//-/_}"
cdb="${db}_cluster"
pg_ctr="seq-$run_id-pg"
emb_ctr="seq-$run_id-emb"
vol="seq-$run_id-data"

fail() { echo "image-test: FAIL: $*" >&2; exit 1; }
cleanup() {
  rc=$?
  if [ $rc -ne 0 ]; then
    for c in "$pg_ctr" "$emb_ctr" "seq-$run_id-c1" "seq-$run_id-c2" "seq-$run_id-c3"; do
      podman container exists "$c" 2>/dev/null && { echo "--- logs of $c"; podman logs "$c" 2>&1 | tail -40; }
    done
  fi
  podman rm -f -i -v -t 0 "$pg_ctr" >/dev/null 2>&1 || true
  podman rm -f -i -v -t 0 "$emb_ctr" >/dev/null 2>&1 || true
  for i in 1 2 3; do podman rm -f -i -v -t 0 "seq-$run_id-c$i" >/dev/null 2>&1 || true; done
  podman volume rm -f "$vol" >/dev/null 2>&1 || true
  psql -h "$PGHOST" -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  psql -h "$PGHOST" -U postgres -qc "DROP DATABASE IF EXISTS $cdb WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$PODMAN_CONF_DIR"
  exit $rc
}
trap cleanup EXIT

# addr CONTAINER: the API address from the newest "serving" log line (the
# node listens on 127.0.0.1:0 in the host network, so no port can collide).
addr() {
  local a="" deadline=$((SECONDS + 60))
  while [ -z "$a" ]; do
    [ $SECONDS -lt $deadline ] || fail "$1: no \"serving\" log line within 60s"
    [ "$(podman inspect --format '{{.State.Running}}' "$1")" = true ] || fail "$1 exited: $(podman logs "$1" 2>&1 | tail -5)"
    a=$(podman logs "$1" 2>&1 | sed -n '/"msg":"serving"/s/.*"listen":"\([^"]*\)".*/\1/p' | tail -n1)
    [ -n "$a" ] || sleep 0.2
  done
  echo "$a"
}

wait_ready() { # CONTAINER ADDR: /readyz 200, probed by the image's own binary
  local deadline=$((SECONDS + 60))
  until podman exec "$1" /sequencer health --url "http://$2/readyz" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$1: /readyz not 200 within 60s"
    sleep 0.2
  done
}

send() { # ADDR CONV CLIENT_MSG_ID -> prints the response
  curl -sS --fail-with-body -m 10 "http://$1/sequencer.v1.SequencerService/Send" -H 'Content-Type: application/json' \
    -d "{\"convId\":\"$2\",\"fromUid\":\"1001\",\"clientMsgId\":\"$3\",\"body\":\"aGk=\"}"
}

expect_seq() { # ADDR CONV CLIENT_MSG_ID SEQ
  local out
  out=$(send "$1" "$2" "$3") || fail "send $2/$3: $out"
  grep -q "\"seq\":\"$4\"" <<<"$out" || fail "send $2/$3: want seq $4, got $out"
}

stop_clean() { # CONTAINER: SIGTERM, exit 0, drained
  podman stop -t 60 "$1" >/dev/null
  local code logs
  code=$(podman inspect --format '{{.State.ExitCode}}' "$1")
  logs=$(podman logs "$1" 2>&1)
  [ "$code" = 0 ] || fail "$1: exit code $code after SIGTERM"
  tail -n 5 <<<"$logs" | grep -q '"msg":"stopped cleanly"' || fail "$1: no \"stopped cleanly\" after SIGTERM: $(echo "$logs" | tail -5)"
  grep -q '"msg":"draining"' <<<"$logs" || fail "$1: no \"draining\" log line"
}

echo "== build"
bash scripts/image.sh

echo "== the image: non-root numeric user, no shell"
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
[ "$user" = 65532:65532 ] || fail "image user $user, want 65532:65532"
if podman run --rm --entrypoint /bin/sh "$IMAGE" -c true >/dev/null 2>&1; then fail "the image has a shell"; fi
v=$(podman run --rm "$IMAGE" version) || fail "sequencer version in the image: $v"
grep -q "commit $(git rev-parse --short=12 HEAD)" <<<"$v" || fail "sequencer version in the image: $v, want commit $(git rev-parse --short=12 HEAD)"
echo "ok: $v, user $user, no /bin/sh"

echo "== PostgreSQL store ($db, host network)"
psql -h "$PGHOST" -U postgres -qc "CREATE DATABASE $db" >/dev/null
podman run -d --name "$pg_ctr" --network host "$IMAGE" serve \
  --listen 127.0.0.1:0 --store "$PGURL/$db" --node-id "$pg_ctr" --log-format json >/dev/null
a=$(addr "$pg_ctr")
wait_ready "$pg_ctr" "$a"
expect_seq "$a" g:img 1 1
expect_seq "$a" g:img 2 2
expect_seq "$a" g:img 3 3
dup=$(send "$a" g:img 2) || fail "resend: $dup"
grep -q '"seq":"2"' <<<"$dup" && grep -q '"duplicate":true' <<<"$dup" || fail "resend of client_msg_id 2: $dup"
pull=$(curl -sS --fail-with-body -m 10 "http://$a/sequencer.v1.SequencerService/Pull" -H 'Content-Type: application/json' \
  -d '{"convId":"g:img","afterSeq":"0"}') || fail "pull: $pull"
grep -q '"headSeq":"3"' <<<"$pull" || fail "pull: want headSeq 3, got $pull"
[ "$(echo "$pull" | grep -o '"seq":"[0-9]*"' | tr '\n' ' ')" = '"seq":"1" "seq":"2" "seq":"3" ' ] || fail "pull: want seqs 1 2 3, got $pull"
metrics=$(curl -sS --fail-with-body -m 10 "http://$a/metrics") || fail "/metrics: $metrics"
grep -q '^sequencer_build_info{' <<<"$metrics" || fail "no sequencer_build_info on /metrics"
stop_clean "$pg_ctr"
rows=$(psql -h "$PGHOST" -U postgres -d "$db" -Atc "SELECT count(*) || ' ' || max(seq) FROM im_message WHERE conv_id = 'g:img'")
[ "$rows" = "3 3" ] || fail "want 3 rows up to seq 3 in $db, found (count max) $rows"
held=$(psql -h "$PGHOST" -U postgres -d "$db" -Atc "SELECT count(*) FROM worker_lease WHERE holder = '$pg_ctr' AND expires_at IS NOT NULL")
[ "$held" = 0 ] || fail "the stopped node still holds its worker-id lease"
echo "ok: 3 sends, a duplicate, a pull, SIGTERM drained, exit 0, 3 rows stored, worker-id lease released"

echo "== embedded store on volume $vol"
podman volume create "$vol" >/dev/null
podman run -d --name "$emb_ctr" --network host -v "$vol:/data" "$IMAGE" serve \
  --listen 127.0.0.1:0 --log-format json >/dev/null
a=$(addr "$emb_ctr")
wait_ready "$emb_ctr" "$a"
expect_seq "$a" g:vol a 1
expect_seq "$a" g:vol b 2
stop_clean "$emb_ctr"
logs_before=$(podman logs "$emb_ctr" 2>&1 | grep -c '"msg":"serving"')
podman start "$emb_ctr" >/dev/null
deadline=$((SECONDS + 60))
until [ "$(podman logs "$emb_ctr" 2>&1 | grep -c '"msg":"serving"')" -gt "$logs_before" ]; do
  [ $SECONDS -lt $deadline ] || fail "$emb_ctr: no second \"serving\" line after restart"
  sleep 0.2
done
a=$(addr "$emb_ctr")
wait_ready "$emb_ctr" "$a"
expect_seq "$a" g:vol c 3
dup=$(send "$a" g:vol a) || fail "resend after restart: $dup"
grep -q '"seq":"1"' <<<"$dup" && grep -q '"duplicate":true' <<<"$dup" || fail "resend of a after restart: $dup"
stop_clean "$emb_ctr"
echo "ok: embedded store survived a restart on the volume: seq continued at head+1 (3), dedup kept"
echo "== cluster: three nodes on $cdb"
psql -h "$PGHOST" -U postgres -qc "CREATE DATABASE $cdb" >/dev/null
declare -A caddr
for i in 1 2 3; do
  podman run -d --name "seq-$run_id-c$i" --network host "$IMAGE" serve --listen 127.0.0.1:0 \
    --cluster-listen 127.0.0.1:0 --store "$PGURL/$cdb" --node-id "c$i" --log-format json >/dev/null
done
for i in 1 2 3; do caddr[$i]=$(addr "seq-$run_id-c$i"); done
for i in 1 2 3; do wait_ready "seq-$run_id-c$i" "${caddr[$i]}"; done
owner() { # ADDR CONV -> node id
  curl -sS --fail-with-body -m 10 "http://$1/sequencer.v1.SequencerService/Route" -H 'Content-Type: application/json' \
    -d "{\"convId\":\"$2\"}" | sed -n 's/.*"nodeId":"\([^"]*\)".*/\1/p'
}
# send_retry ADDR CONV ID SEQ: a send during a hand-off may be refused
# retryably (unavailable, 503); resend with the same client_msg_id.
send_retry() {
  local out deadline=$((SECONDS + 30))
  while :; do
    if out=$(send "$1" "$2" "$3"); then
      grep -q "\"seq\":\"$4\"" <<<"$out" || fail "send $2/$3 via $1: want seq $4, got $out"
      return
    fi
    grep -qE '"code":"(unavailable|resource_exhausted)"' <<<"$out" || fail "send $2/$3 via $1: $out"
    [ $SECONDS -lt $deadline ] || fail "send $2/$3 via $1: still $out after 30s"
    sleep 0.2
  done
}
# Wait until every node sees all three (Route answers from each node's view).
deadline=$((SECONDS + 60))
until [ "$(for c in $(seq 1 12); do owner "${caddr[1]}" "g:c$c"; echo; done | sort -u | grep -c .)" = 3 ]; do
  [ $SECONDS -lt $deadline ] || fail "the three nodes did not share the conversations within 60s"
  sleep 0.3
done
# Twelve conversations, each sent to through every node in turn: most sends are forwarded.
for c in $(seq 1 12); do
  for i in 1 2 3; do send_retry "${caddr[$i]}" "g:c$c" "c$c-$i" "$i"; done
done
forwards=$(for i in 1 2 3; do curl -sS -m 10 "http://${caddr[$i]}/metrics"; done | awk '/^sequencer_cluster_forwards_total\{result="ok"\}/ {s += $2} END {print s + 0}')
[ "$forwards" -gt 0 ] || fail "no forwarded sends counted (sequencer_cluster_forwards_total)"
moved=$(for c in $(seq 1 12); do owner "${caddr[1]}" "g:c$c"; echo; done | grep -c '^c2$' || true)
[ "$moved" -gt 0 ] || fail "node c2 owns none of the 12 conversations"
stop_clean "seq-$run_id-c2"
for c in $(seq 1 12); do
  send_retry "${caddr[1]}" "g:c$c" "c$c-after" 4
done
stored=$(psql -h "$PGHOST" -U postgres -d "$cdb" -Atc "SELECT count(*) || ' ' || count(DISTINCT conv_id) || ' ' || max(seq) FROM im_message")
[ "$stored" = "48 12 4" ] || fail "cluster database holds (rows convs max seq) $stored, want 48 12 4"
for i in 1 3; do stop_clean "seq-$run_id-c$i"; done
echo "ok: 3 nodes, $forwards sends forwarded, c2 stopped with SIGTERM (exit 0) and its $moved conversations continued at head+1, all 3 drained"
echo "image-test: PASS"
