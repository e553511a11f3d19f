#!/usr/bin/env bash
# Provision Kueue for the queueing control-plane tests: the `kueue` manager binary built from its Go module
# (sigs.k8s.io/kueue/cmd/kueue) and the CRDs of the same module version (config/components/crd/bases), so the
# binary and the CRDs it serves can never drift apart.
#
# Everything goes into a cache outside the repository; a second run finds the binary and does nothing.
#   ASYNCRL_KUEUE_VERSION   Kueue release (default 0.17.0)
#   ASYNCRL_CACHE_DIR       cache root (default ~/.cache/asyncrl)
# Go caches are shared with scripts/provision-k8s.sh and provision-kuberay.sh (same GOMODCACHE/GOCACHE), so the
# Kubernetes libraries the builds share are downloaded once. The last line of output is the Kueue directory
# (bin/ and crds/).
set -euo pipefail

KUEUE_VERSION="${ASYNCRL_KUEUE_VERSION:-0.17.0}"
KUEUE_VERSION="${KUEUE_VERSION#v}"
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
KUEUE_DIR="$CACHE_DIR/kueue/v$KUEUE_VERSION"
MODULE="sigs.k8s.io/kueue"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-kueue: error: %s\n' "$*" >&2; exit 1; }

if [ -x "$KUEUE_DIR/bin/kueue" ] && [ -s "$KUEUE_DIR/crds/kueue.x-k8s.io_workloads.yaml" ]; then
  step "Kueue v$KUEUE_VERSION present in $KUEUE_DIR"
  echo "$KUEUE_DIR"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= 1.25 (https://go.dev/dl) and run again"
mkdir -p "$KUEUE_DIR/bin" "$KUEUE_DIR/crds" "$GOMODCACHE" "$GOCACHE"
start=$(date +%s)
module_dir=$(go mod download -json "$MODULE@v$KUEUE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -n "$module_dir" ] && [ -d "$module_dir/config/components/crd/bases" ] \
  || die "could not download $MODULE@v$KUEUE_VERSION from the Go module proxy ($(go env GOPROXY))"
step "building kueue v$KUEUE_VERSION (go install $MODULE/cmd/kueue)"
# The module has no replace directives, so `go install module/cmd@version` builds exactly its go.sum graph.
rm -rf "$KUEUE_DIR/bin.tmp"
GOBIN="$KUEUE_DIR/bin.tmp" go install -trimpath -ldflags "-s -w" "$MODULE/cmd/kueue@v$KUEUE_VERSION" >&2
mv "$KUEUE_DIR/bin.tmp/kueue" "$KUEUE_DIR/bin/kueue" && rmdir "$KUEUE_DIR/bin.tmp"
install -m 0644 "$module_dir"/config/components/crd/bases/*.yaml "$KUEUE_DIR/crds/"
step "Kueue v$KUEUE_VERSION ready in $KUEUE_DIR ($(( $(date +%s) - start ))s)"
echo "$KUEUE_DIR"
