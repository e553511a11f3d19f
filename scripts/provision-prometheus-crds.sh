#!/usr/bin/env bash
# Provision the prometheus-operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule) for the chart's tests:
# the chart's monitors, alert rules and dashboard are applied to the local control plane, whose API server
# then checks them against the CRDs' own schemas. The CRDs come from the prometheus-operator Go module
# (example/prometheus-operator-crd), so the test uses exactly what that release ships.
#
# Everything goes into a cache outside the repository; a second run finds the files and does nothing.
#   ASYNCRL_PROMETHEUS_OPERATOR_VERSION   prometheus-operator release (default 0.85.0)
#   ASYNCRL_CACHE_DIR                     cache root (default ~/.cache/asyncrl)
# The last line of output is the directory holding the CRD files.
set -euo pipefail

VERSION="${ASYNCRL_PROMETHEUS_OPERATOR_VERSION:-0.85.0}"
VERSION="${VERSION#v}"
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
CRD_DIR="$CACHE_DIR/prometheus-operator/v$VERSION/crds"
MODULE="github.com/prometheus-operator/prometheus-operator"
CRDS=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml
  monitoring.coreos.com_prometheusrules.yaml)
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOFLAGS="-modcacherw"

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-prometheus-crds: error: %s\n' "$*" >&2; exit 1; }

present=1
for crd in "${CRDS[@]}"; do [ -s "$CRD_DIR/$crd" ] || present=0; done
if [ "$present" = 1 ]; then
  step "prometheus-operator v$VERSION CRDs present in $CRD_DIR"
  echo "$CRD_DIR"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= 1.24 (https://go.dev/dl) and run again"
mkdir -p "$CRD_DIR" "$GOMODCACHE"
module_dir=$(go mod download -json "$MODULE@v$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -n "$module_dir" ] && [ -d "$module_dir/example/prometheus-operator-crd" ] \
  || die "could not download $MODULE@v$VERSION from the Go module proxy ($(go env GOPROXY))"
for crd in "${CRDS[@]}"; do
  install -m 0644 "$module_dir/example/prometheus-operator-crd/$crd" "$CRD_DIR/$crd"
done
step "prometheus-operator v$VERSION CRDs ready in $CRD_DIR"
echo "$CRD_DIR"
