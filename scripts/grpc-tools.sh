#!/usr/bin/env bash
# Installs the gRPC command-line tools that e2e/grpctools_test.go runs against
# the real binary: grpcurl and grpc-health-probe, built with `go install` from
# the Go module proxy at pinned versions, into bin/grpc-tools (or $GRPC_TOOLS_BIN).
# A tool already there at its pinned version is kept. Run by .ci/run and by
# `make grpc-tools`; the e2e tests look in that directory, then in PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
GRPCURL_VERSION=v1.9.3
HEALTH_PROBE_VERSION=v0.4.62
dir="${GRPC_TOOLS_BIN:-$PWD/bin/grpc-tools}"
mkdir -p "$dir"

install() { # install NAME MODULE PACKAGE VERSION
  local name=$1 mod=$2 pkg=$3 version=$4
  if [ -x "$dir/$name" ] && go version -m "$dir/$name" 2>/dev/null | grep -qE "^\s+mod\s+$mod\s+$version\s"; then
    echo "$name $version: already in $dir"
    return
  fi
  echo "installing $name $version into $dir (go install $pkg@$version)"
  GOBIN="$dir" GOFLAGS=-buildvcs=false go install "$pkg@$version"
}
install grpcurl github.com/fullstorydev/grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION"
install grpc-health-probe github.com/grpc-ecosystem/grpc-health-probe github.com/grpc-ecosystem/grpc-health-probe "$HEALTH_PROBE_VERSION"
