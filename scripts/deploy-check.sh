#!/usr/bin/env bash
# make deploy-check: validate deploy/ with the real tools, and run the
# Prometheus test. What each step proves:
#   promtool check rules / test rules   alert rules are valid and fire on synthetic series
#   promtool check config               the compose stack's Prometheus configuration is valid
#   docker-compose config               deploy/compose.yaml is a valid compose file (parsed, NOT started:
#                                       its postgres/prometheus/grafana images cannot be pulled here)
#   systemd-analyze verify              the unit file is valid for this systemd (not started)
#   go test in deploy/kubecheck         the Kubernetes manifests decode strictly into k8s.io/api types
#                                       (schema only: never applied to a cluster)
#   go test ./deploy (SEQUENCER_TEST_PROMETHEUS=1)
#                                       YAML fields checked; a real Prometheus scrapes real nodes and
#                                       every dashboard query returns data; the rules load and evaluate
# Missing tools are installed from Debian (prometheus, docker-compose, systemd);
# any failure or warning fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

need=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || need+=(prometheus)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (Debian packages)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}") >/dev/null
fi
tmp=$(mktemp -d /tmp/sequencer-deploy-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "== promtool check rules, test rules"
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts_test.yaml

echo "== promtool check config (compose's prometheus.yml, rule path pointed at deploy/)"
sed "s#/etc/prometheus/alerts.yaml#$PWD/deploy/prometheus/alerts.yaml#" deploy/prometheus/prometheus.yml >"$tmp/prometheus.yml"
promtool check config "$tmp/prometheus.yml"

echo "== docker-compose config (parse and validate only)"
docker-compose -f deploy/compose.yaml config -q

echo "== systemd-analyze verify (ExecStart pointed at a freshly built binary)"
CGO_ENABLED=0 go build -o "$tmp/sequencer" ./cmd/sequencer
sed "s#/usr/local/bin/sequencer#$tmp/sequencer#" deploy/systemd/sequencer.service >"$tmp/sequencer.service"
# verify exits 0 on unknown keys and bad values, printing a warning: any output fails.
out=$(systemd-analyze verify "$tmp/sequencer.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "$out"; echo "systemd-analyze verify: warnings above" >&2; exit 1; fi
echo "ok"

echo "== Kubernetes manifests decode strictly into k8s.io/api types (deploy/kubecheck, its own module)"
(cd deploy/kubecheck && go test -count=1 ./...)

echo "== go test ./deploy (with a real Prometheus)"
SEQUENCER_TEST_PROMETHEUS=1 go test -count=1 ./deploy/
