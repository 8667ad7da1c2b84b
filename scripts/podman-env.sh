# Sourced by scripts/image.sh and scripts/image-test.sh: makes podman, buildah
# and runc available and points podman at a containers.conf of our own.
# On this kind of machine crun cannot set rlimits, so containers run with the
# runc runtime and default_ulimits = []; both are passed through CONTAINERS_CONF
# and --runtime, never by editing /etc.

need=()
command -v podman >/dev/null || need+=(podman)
command -v buildah >/dev/null || need+=(buildah)
command -v runc >/dev/null && [ -x "$(command -v runc)" ] || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (Debian packages)"
  if [ "$(id -u)" -ne 0 ]; then echo "need root to apt-get install ${need[*]}" >&2; exit 1; fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}") >/dev/null
fi
RUNC=$(command -v runc)
PODMAN_CONF_DIR=${PODMAN_CONF_DIR:-$(mktemp -d /tmp/sequencer-podman.XXXXXX)}
cat >"$PODMAN_CONF_DIR/containers.conf" <<CONF
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$PODMAN_CONF_DIR/containers.conf"
podman() { command podman --runtime "$RUNC" "$@"; }
IMAGE=${IMAGE:-localhost/sequencer:dev}
