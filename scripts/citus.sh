#!/usr/bin/env bash
# Citus for tests: build Citus 13.2.2 into Debian's PostgreSQL 15, start and
# stop a throwaway cluster of a coordinator and two workers.
#
#   scripts/citus.sh build          build and install citus.so unless installed
#   scripts/citus.sh start DIR      initdb 3 clusters under DIR, start them on
#                                   random free ports of 127.0.0.1; prints
#                                   SEQUENCER_TEST_CITUS_URL=... (the
#                                   coordinator's admin DSN) and the workers'
#   scripts/citus.sh createdb DIR NAME  a Citus database NAME on them (extension,
#                                   coordinator and workers registered); prints its DSN
#   scripts/citus.sh stop DIR       stop them (pg_ctl -m fast)
#
# The source is ../shared/citus/citus-13.2.2.tar.gz relative to the repository
# root (the CI clone has shared/ beside it), or $CITUS_TARBALL. It is unpacked
# in a temporary directory; the one fix PostgreSQL 15.20 needs (it exports
# have_createdb_privilege, which Citus's pg_version_compat.h also defines) is
# applied there with sed. No Citus code enters this repository (AGPL-3.0).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
PGBIN="${SEQUENCER_TEST_POSTGRES_BIN:-$(ls -d /usr/lib/postgresql/15/bin 2>/dev/null || true)}"
PG_CONFIG="${PG_CONFIG:-$PGBIN/pg_config}"
[ -x "$PG_CONFIG" ] || PG_CONFIG=pg_config

installed() { [ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ] && [ -f "$("$PG_CONFIG" --sharedir)/extension/citus.control" ]; }

build() {
  if installed; then
    echo "citus: already installed in $("$PG_CONFIG" --pkglibdir)"
    return 0
  fi
  tarball="${CITUS_TARBALL:-$root/../shared/citus/citus-13.2.2.tar.gz}"
  [ -f "$tarball" ] || { echo "citus: no source archive at $tarball (set CITUS_TARBALL)" >&2; exit 1; }
  echo "citus: installing the build dependencies (Debian)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    build-essential postgresql-server-dev-15 liblz4-dev libzstd-dev libcurl4-openssl-dev \
    libkrb5-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev) >/dev/null
  # A fixed build directory: a build that was interrupted resumes there.
  work="${CITUS_BUILD_DIR:-/var/tmp/citus-build}"
  mkdir -p "$work"
  if [ ! -f "$work/.unpacked" ]; then
    rm -rf "$work"/citus-*
    tar -xzf "$tarball" -C "$work"
    src="$(ls -d "$work"/citus-*)"
    # PostgreSQL 15.20 exports have_createdb_privilege; rename Citus's static
    # compat copy (its first definition) so the two do not collide.
    sed -i '0,/have_createdb_privilege(void)/s//citus_compat_have_createdb_privilege(void)/' \
      "$src/src/include/pg_version_compat.h"
    (cd "$src" && PG_CONFIG="$PG_CONFIG" ./configure --quiet >/dev/null)
    touch "$work/.unpacked"
  fi
  src="$(ls -d "$work"/citus-*)"
  echo "citus: building $(basename "$src") (about 100 s)"
  # with_llvm=no: no LLVM bitcode for PostgreSQL's JIT (halves the build).
  if ! (cd "$src" && make -s -j"$(nproc)" with_llvm=no >"$work/make.log" 2>&1 &&
    make -s install with_llvm=no >>"$work/make.log" 2>&1); then
    tail -n 30 "$work/make.log" >&2
    echo "citus: build failed (log: $work/make.log; run again to resume)" >&2
    exit 1
  fi
  rm -rf "$work"
  installed || { echo "citus: build finished but citus.so is not installed" >&2; exit 1; }
  echo "citus: installed into $("$PG_CONFIG" --pkglibdir)"
}

freeport() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

asuser() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
  dir="$1"
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  : >"$dir/env"
  for node in coordinator worker1 worker2; do
    port="$(freeport)"
    asuser "$PGBIN/initdb" -D "$dir/$node" -U postgres -A trust --no-instructions >/dev/null
    cat >>"$dir/$node/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
shared_preload_libraries = 'citus,pg_stat_statements'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
fsync = on
synchronous_commit = on
full_page_writes = on
max_connections = 300
max_prepared_transactions = 100
citus.shard_replication_factor = 1
EOF
    asuser "$PGBIN/pg_ctl" -D "$dir/$node" -l "$dir/$node.log" -w -t 60 start >/dev/null
    echo "$node=$port" >>"$dir/env"
  done
  # shellcheck disable=SC1091
  . "$dir/env"
  echo "SEQUENCER_TEST_CITUS_URL=postgres://postgres@127.0.0.1:$coordinator/postgres"
  echo "SEQUENCER_TEST_CITUS_WORKERS=127.0.0.1:$worker1,127.0.0.1:$worker2"
}

# createdb DIR NAME: a database NAME on the three nodes of DIR's cluster,
# with the citus extension, the coordinator and the workers registered in
# it; prints its coordinator DSN (for sequencer --store or the bench's
# --citus).
createdb() {
  dir="$1" name="$2"
  # shellcheck disable=SC1091
  . "$dir/env"
  for port in "$coordinator" "$worker1" "$worker2"; do
    psql -h 127.0.0.1 -p "$port" -U postgres -qAt -c "CREATE DATABASE \"$name\"" >/dev/null
    psql -h 127.0.0.1 -p "$port" -U postgres -d "$name" -qAt -c "CREATE EXTENSION citus" >/dev/null
  done
  psql -h 127.0.0.1 -p "$coordinator" -U postgres -d "$name" -qAt \
    -c "SELECT citus_set_coordinator_host('127.0.0.1', $coordinator)" \
    -c "SELECT citus_add_node('127.0.0.1', $worker1)" \
    -c "SELECT citus_add_node('127.0.0.1', $worker2)" >/dev/null
  echo "postgres://postgres@127.0.0.1:$coordinator/$name"
}

stop() {
  dir="$1"
  for node in coordinator worker1 worker2; do
    [ -d "$dir/$node" ] && asuser "$PGBIN/pg_ctl" -D "$dir/$node" -m fast -w stop >/dev/null 2>&1 || true
  done
}

case "${1:-}" in
build) build ;;
start) start "${2:?usage: citus.sh start DIR}" ;;
stop) stop "${2:?usage: citus.sh stop DIR}" ;;
createdb) createdb "${2:?usage: citus.sh createdb DIR NAME}" "${3:?usage: citus.sh createdb DIR NAME}" ;;
installed) installed ;;
*) echo "usage: $0 build | start DIR | createdb DIR NAME | stop DIR | installed" >&2; exit 2 ;;
esac
