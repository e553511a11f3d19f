#!/usr/bin/env bash
# Provision Toxiproxy for the soak (benchmarks/soak.py and its short version under tests/): the server
# (`toxiproxy-server`) and its CLI (`toxiproxy-cli`), both built from their Go module
# (github.com/Shopify/toxiproxy/v2, cmd/server and cmd/cli) at one version, so the two never drift apart.
#
# Everything goes into a cache outside the repository; a second run finds the binaries and does nothing.
#   ASYNCRL_TOXIPROXY_VERSION   Toxiproxy release (default 2.12.0)
#   ASYNCRL_CACHE_DIR           cache root (default ~/.cache/asyncrl)
# Go caches are shared with scripts/provision-k8s.sh and scripts/provision-kuberay.sh (same GOMODCACHE and
# GOCACHE). The last line of output is the bin directory (toxiproxy-server, toxiproxy-cli).
set -euo pipefail

TOXIPROXY_VERSION="${ASYNCRL_TOXIPROXY_VERSION:-2.12.0}"
TOXIPROXY_VERSION="${TOXIPROXY_VERSION#v}"
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
BIN_DIR="$CACHE_DIR/toxiproxy/v$TOXIPROXY_VERSION/bin"
MODULE="github.com/Shopify/toxiproxy/v2"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-toxiproxy: error: %s\n' "$*" >&2; exit 1; }

if [ -x "$BIN_DIR/toxiproxy-server" ] && [ -x "$BIN_DIR/toxiproxy-cli" ]; then
  step "Toxiproxy v$TOXIPROXY_VERSION present in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= 1.23 (https://go.dev/dl) and run again"
mkdir -p "$BIN_DIR" "$GOMODCACHE" "$GOCACHE"
start=$(date +%s)
go mod download -json "$MODULE@v$TOXIPROXY_VERSION" >/dev/null \
  || die "could not download $MODULE@v$TOXIPROXY_VERSION from the Go module proxy ($(go env GOPROXY))"
tmp="$BIN_DIR.tmp"
rm -rf "$tmp"
for cmd in server cli; do
  step "building toxiproxy-$cmd v$TOXIPROXY_VERSION (go install $MODULE/cmd/$cmd)"
  # The module has no replace directives, so `go install module/cmd@version` builds exactly its go.sum graph.
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$MODULE/cmd/$cmd@v$TOXIPROXY_VERSION" >&2 \
    || die "building $MODULE/cmd/$cmd@v$TOXIPROXY_VERSION failed (see above)"
  mv "$tmp/$cmd" "$BIN_DIR/toxiproxy-$cmd"
done
rmdir "$tmp"
step "Toxiproxy v$TOXIPROXY_VERSION ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
echo "$BIN_DIR"
