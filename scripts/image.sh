#!/usr/bin/env bash
# make image: build the sequencer image (deploy/Containerfile) with podman.
# The binary is built here, static (CGO_ENABLED=0), and copied into an image
# FROM scratch; nothing is pulled from a registry. IMAGE names the result
# (default localhost/sequencer:dev); VERSION and COMMIT stamp it like make build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
. scripts/podman-env.sh

VERSION=${VERSION:-$(git describe --tags --match 'v*' --dirty 2>/dev/null || echo dev)}
COMMIT=${COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo -dirty)}
ctx=$(mktemp -d /tmp/sequencer-image.XXXXXX)
trap 'rm -rf "$ctx" "$PODMAN_CONF_DIR"' EXIT

CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X github.com/sequencer-im/sequencer/buildinfo.version=$VERSION -X github.com/sequencer-im/sequencer/buildinfo.commit=$COMMIT" \
  -o "$ctx/sequencer" ./cmd/sequencer
# A static binary or the image cannot run it (there is no libc in scratch).
if ! go version -m "$ctx/sequencer" | grep -q 'CGO_ENABLED=0'; then
  echo "image: the binary was not built with CGO_ENABLED=0" >&2; exit 1
fi
ca=/etc/ssl/certs/ca-certificates.crt
if [ -f "$ca" ]; then cp "$ca" "$ctx/"; else : >"$ctx/ca-certificates.crt"; echo "image: no $ca on this host; the image has no CA bundle" >&2; fi
mkdir "$ctx/data"
cp LICENSE NOTICE "$ctx/"
cp deploy/Containerfile "$ctx/Containerfile"

podman build --quiet --format oci -f "$ctx/Containerfile" \
  --build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" -t "$IMAGE" "$ctx" >/dev/null
echo "built $IMAGE ($VERSION, commit $COMMIT): $(podman image inspect --format '{{.Size}}' "$IMAGE") bytes"
