#!/usr/bin/env bash
# Provision the KubeRay operator for the multi-node control-plane tests: the `ray-operator` binary built
# from its Go module (github.com/ray-project/kuberay/ray-operator) and the CRDs of the same module version
# (config/crd/bases), so the binary and the CRDs it serves can never drift apart.
#
# Everything goes into a cache outside the repository; a second run finds the binary and does nothing.
#   ASYNCRL_KUBERAY_VERSION   KubeRay release (default 1.5.0)
#   ASYNCRL_CACHE_DIR         cache root (default ~/.cache/asyncrl)
# Go caches are shared with scripts/provision-k8s.sh (same GOMODCACHE/GOCACHE), so the Kubernetes libraries
# both builds use are downloaded once. The last line of output is the KubeRay directory (bin/ and crds/).
set -euo pipefail

KUBERAY_VERSION="${ASYNCRL_KUBERAY_VERSION:-1.5.0}"
KUBERAY_VERSION="${KUBERAY_VERSION#v}"
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
KUBERAY_DIR="$CACHE_DIR/kuberay/v$KUBERAY_VERSION"
MODULE="github.com/ray-project/kuberay/ray-operator"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-kuberay: error: %s\n' "$*" >&2; exit 1; }

# Every CRD the operator watches: without RayJob's and RayService's it waits for their caches and exits after
# two minutes ("timed out waiting for cache to be synced"), as a user's KubeRay would without them.
CRDS="ray.io_rayclusters.yaml ray.io_rayjobs.yaml ray.io_rayservices.yaml"
all_crds() { for crd in $CRDS; do [ -s "$KUBERAY_DIR/crds/$crd" ] || return 1; done; }

if [ -x "$KUBERAY_DIR/bin/ray-operator" ] && all_crds; then
  step "KubeRay v$KUBERAY_VERSION present in $KUBERAY_DIR"
  echo "$KUBERAY_DIR"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= 1.24 (https://go.dev/dl) and run again"
mkdir -p "$KUBERAY_DIR/bin" "$KUBERAY_DIR/crds" "$GOMODCACHE" "$GOCACHE"
start=$(date +%s)
module_dir=$(go mod download -json "$MODULE@v$KUBERAY_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -n "$module_dir" ] && [ -d "$module_dir/config/crd/bases" ] \
  || die "could not download $MODULE@v$KUBERAY_VERSION from the Go module proxy ($(go env GOPROXY))"
if [ ! -x "$KUBERAY_DIR/bin/ray-operator" ]; then
  step "building ray-operator v$KUBERAY_VERSION (go install $MODULE)"
  # The module has no replace directives, so `go install module@version` builds exactly its go.sum graph.
  GOBIN="$KUBERAY_DIR/bin.tmp" go install -trimpath -ldflags "-s -w" "$MODULE@v$KUBERAY_VERSION" >&2
  mv "$KUBERAY_DIR/bin.tmp/ray-operator" "$KUBERAY_DIR/bin/ray-operator" && rmdir "$KUBERAY_DIR/bin.tmp"
fi
for crd in $CRDS; do
  install -m 0644 "$module_dir/config/crd/bases/$crd" "$KUBERAY_DIR/crds/$crd"
done
step "KubeRay v$KUBERAY_VERSION ready in $KUBERAY_DIR ($(( $(date +%s) - start ))s)"
echo "$KUBERAY_DIR"
