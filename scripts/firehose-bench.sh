#!/bin/bash
# The firehose's bench (docs/BENCHMARKS.md, "The firehose"): one `sequencer
# serve` on a fresh PostgreSQL database, with (on) or without (off) --feed-nats
# to a private nats-server -js, loaded by `sequencer-bench --target ...
# --engines e-batch --scenarios many`. With `outage`, NATS is killed before the
# load and started after it, and the time until sequencer_feed_lag_messages is
# 0 is the drain time. The publish lag comes from the node's
# sequencer_feed_publish_lag_seconds histogram (metrics.txt).
# usage: scripts/firehose-bench.sh NAME on|off SENDERS(0: the scenario's) [outage]
# It also prints the CPU the node, nats-server and PostgreSQL used during the load.
# env: B (dir of sequencer and sequencer-bench, default ./bin), DUR (default 15s),
#      MSGS (if set: the load sends exactly this many messages instead of running DUR),
#      PROF=1 (a CPU profile of the node), OUT (default /tmp/firehose-bench),
#      PGPORT (the PostgreSQL on 127.0.0.1 to use, default 5432; with
#      pg_stat_statements installed there, STATS=1 resets it before the load and
#      prints the statements that took the most execution time after it)
set -e
B=${B:-./bin}; NAME=$1; FEED=$2; SENDERS=$3; OUTAGE=$4
D=${OUT:-/tmp/firehose-bench}/$NAME; rm -rf $D; mkdir -p $D
DB=firebench_$NAME
PGPORT=${PGPORT:-5432}
psql -q -h 127.0.0.1 -p $PGPORT -U postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
DSN="postgres://postgres@127.0.0.1:$PGPORT/$DB"
$B/sequencer migrate --store $DSN >/dev/null
NPORT=$((20000 + RANDOM % 20000)); APORT=$((20000 + RANDOM % 20000))
ARGS=""
if [ $FEED = on ]; then
  /usr/sbin/nats-server -js -sd $D/nats -p $NPORT -a 127.0.0.1 >$D/nats.log 2>&1 & echo $! > $D/nats.pid
  sleep 1
  ARGS="--feed-nats nats://127.0.0.1:$NPORT --feed-create-stream"
fi
$B/sequencer serve --listen 127.0.0.1:$APORT --store $DSN --log-level info --pprof $ARGS >$D/serve.log 2>&1 & echo $! > $D/serve.pid
for i in $(seq 1 100); do curl -sf http://127.0.0.1:$APORT/readyz >/dev/null && break; sleep 0.1; done
if [ "$OUTAGE" = outage ]; then kill -9 $(cat $D/nats.pid); fi
( [ -n "$PROF" ] && sleep 6 && curl -s -o $D/cpu.pprof "http://127.0.0.1:$APORT/debug/pprof/profile?seconds=8" ) &
SF=""; [ "$SENDERS" != 0 ] && SF="--senders $SENDERS"
LOAD="--duration ${DUR:-15s} --warmup 3s"; [ -n "$MSGS" ] && LOAD="--messages $MSGS"
cpu() { [ -f $D/$1.pid ] && awk '{print $14+$15}' /proc/$(cat $D/$1.pid)/stat 2>/dev/null || echo 0; }
pgcpu() { ps -u postgres -o times= | awk '{s+=$1} END {print s}'; }
[ -n "$STATS" ] && psql -q -h 127.0.0.1 -p $PGPORT -U postgres -c "SELECT pg_stat_statements_reset()" >/dev/null
C0="$(cpu serve) $(cpu nats) $(pgcpu)"; T0=$(date +%s.%N)
$B/sequencer-bench --target http://127.0.0.1:$APORT --engines e-batch --scenarios many $LOAD $SF --progress -1s > $D/bench.txt 2>&1 || true
C1="$(cpu serve) $(cpu nats) $(pgcpu)"; T1=$(date +%s.%N)
grep -E 'e-batch|msgs/s|many' $D/bench.txt | head -5
# the CPU the node, nats-server and PostgreSQL's processes used during the load, in cores
# (clock ticks of 10 ms; PostgreSQL's in whole seconds: ps's times)
echo "$C0 $C1 $T0 $T1" | awk '{w=$8-$7; printf "CPU during the load (%.1f s): node %.2f cores, nats-server %.2f, postgres %.2f\n", w, ($4-$1)/100/w, ($5-$2)/100/w, ($6-$3)/w}'
if [ -n "$STATS" ]; then
  echo "PostgreSQL's statements by execution time (calls | rows | ms | us a call | statement):"
  psql -h 127.0.0.1 -p $PGPORT -U postgres -Atc "SELECT calls, rows, round(total_exec_time::numeric), round((total_exec_time * 1000 / greatest(calls, 1))::numeric), left(regexp_replace(query, '\s+', ' ', 'g'), 100) FROM pg_stat_statements WHERE query NOT ILIKE '%DATABASE%' ORDER BY total_exec_time DESC LIMIT 8"
fi
if [ "$OUTAGE" = outage ]; then
  LAG=$(curl -s http://127.0.0.1:$APORT/metrics | awk '/^sequencer_feed_lag_messages /{print $2}')
  echo "backlog before NATS returns: $LAG"
  /usr/sbin/nats-server -js -sd $D/nats -p $NPORT -a 127.0.0.1 >>$D/nats.log 2>&1 & echo $! > $D/nats.pid
  T0=$(date +%s.%N)
  while true; do
    L=$(curl -s http://127.0.0.1:$APORT/metrics | awk '/^sequencer_feed_lag_messages /{print $2}')
    [ "$L" = 0 ] && break; sleep 0.2
  done
  T1=$(date +%s.%N)
  echo "drained $LAG in $(echo "$T1 - $T0" | bc) s"
fi
curl -s http://127.0.0.1:$APORT/metrics | grep -E '^sequencer_feed_(publish_lag_seconds_(bucket|count|sum)|published_total|lag_messages)' > $D/metrics.txt || true
kill $(cat $D/serve.pid); wait $(cat $D/serve.pid) 2>/dev/null || true
[ -f $D/nats.pid ] && kill $(cat $D/nats.pid) 2>/dev/null || true
psql -q -h 127.0.0.1 -p $PGPORT -U postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null || true
