#!/usr/bin/env bash
# Provision a real local Kubernetes control plane for tests: kube-apiserver, kube-controller-manager,
# kubectl (built from k8s.io/kubernetes with Go), etcd (Debian package or Go build) and helm v3.
#
# Everything goes into a cache outside the repository; a second run finds the binaries and does nothing.
#   ASYNCRL_K8S_VERSION   Kubernetes release to build (default 1.36.3)
#   ASYNCRL_CACHE_DIR     cache root (default ~/.cache/asyncrl)
#   ASYNCRL_K8S_BIN_DIR   where the binaries land (default $ASYNCRL_CACHE_DIR/k8s/v$ASYNCRL_K8S_VERSION/bin)
#   ASYNCRL_HELM_VERSION  helm release (default 3.22.0)
#   ASYNCRL_K8S_EXTRA_BINARIES  more commands of k8s.io/kubernetes/cmd to build beside the control plane, from
#                         the same module and with the same version stamp (scripts/provision-node.sh asks
#                         for "kubelet kube-scheduler kube-proxy")
# The last line of output is the bin directory, so callers can do BIN=$(scripts/provision-k8s.sh | tail -1).
set -euo pipefail

K8S_VERSION="${ASYNCRL_K8S_VERSION:-1.36.3}"
K8S_VERSION="${K8S_VERSION#v}"
HELM_VERSION="${ASYNCRL_HELM_VERSION:-3.22.0}"
HELM_VERSION="${HELM_VERSION#v}"
ETCD_DEBIAN_SUITE="${ASYNCRL_ETCD_DEBIAN_SUITE:-trixie}"
ETCD_GO_VERSION="${ASYNCRL_ETCD_GO_VERSION:-3.5.21}"
K8S_BINARIES=(kube-apiserver kube-controller-manager kubectl ${ASYNCRL_K8S_EXTRA_BINARIES:-})
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
VERSION_DIR="$CACHE_DIR/k8s/v$K8S_VERSION"
BIN_DIR="${ASYNCRL_K8S_BIN_DIR:-$VERSION_DIR/bin}"
WORK_DIR="$VERSION_DIR/work"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-k8s: error: %s\n' "$*" >&2; exit 1; }
have_bin() { [ -x "$BIN_DIR/$1" ]; }

minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
major="${K8S_VERSION%%.*}"
staging_version="v0.$minor.${K8S_VERSION##*.}"

mkdir -p "$BIN_DIR" "$WORK_DIR" "$GOMODCACHE" "$GOCACHE"

require_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= 1.26 (https://go.dev/dl or your package manager) and run again"
}

build_kubernetes() {
  local missing=()
  for b in "${K8S_BINARIES[@]}"; do have_bin "$b" || missing+=("$b"); done
  if [ ${#missing[@]} -eq 0 ]; then step "kubernetes v$K8S_VERSION binaries present in $BIN_DIR"; return; fi
  require_go
  step "building ${missing[*]} v$K8S_VERSION from k8s.io/kubernetes (a cold build takes 15-30 minutes on 2 cores)"
  local mod="$WORK_DIR/kubernetes-wrapper"
  mkdir -p "$mod"
  (
    cd "$mod"
    # k8s.io/kubernetes points its staging modules at ./staging with v0.0.0, so a consumer must replace each
    # one with the published module of the same release. The list comes from the release's own go.mod.
    local gomod_file
    gomod_file=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    [ -f "$gomod_file" ] || die "could not download k8s.io/kubernetes@v$K8S_VERSION from the Go module proxy ($(go env GOPROXY))"
    local go_directive
    go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod_file")
    {
      echo "module asyncrl.dev/k8s-wrapper"
      echo
      echo "go $go_directive"
      echo
      echo "require k8s.io/kubernetes v$K8S_VERSION"
      echo
      sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 '"$staging_version"'#p' "$gomod_file"
    } > go.mod
    step "resolving module graph (go get -tool)"
    local tools=() b
    for b in "${missing[@]}"; do tools+=("k8s.io/kubernetes/cmd/$b@v$K8S_VERSION"); done
    go get -tool "${tools[@]}" >&2
    local pkg="k8s.io/component-base/version" cpkg="k8s.io/client-go/pkg/version"
    local ldflags="-s -w"
    for p in "$pkg" "$cpkg"; do
      ldflags+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
      ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    for b in "${missing[@]}"; do
      step "go build $b"
      go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$BIN_DIR/$b.tmp" "k8s.io/kubernetes/cmd/$b"
      mv "$BIN_DIR/$b.tmp" "$BIN_DIR/$b"
    done
  )
}

etcd_from_debian() {
  command -v curl >/dev/null 2>&1 || return 1
  command -v dpkg-deb >/dev/null 2>&1 || return 1
  command -v xz >/dev/null 2>&1 || return 1
  local base="${ASYNCRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  local arch
  arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
  step "looking up etcd-server in Debian $ETCD_DEBIAN_SUITE ($base)"
  local entry filename sha
  local index="$WORK_DIR/Packages-$ETCD_DEBIAN_SUITE.xz"
  curl -fsSL -m 120 -o "$index" "$base/dists/$ETCD_DEBIAN_SUITE/main/binary-$arch/Packages.xz" || return 1
  # Read the whole index (no early exit) so that pipefail does not see a SIGPIPE'd xz.
  entry=$(xz -dc "$index" | awk '/^Package: /{p=($2=="etcd-server")} p') || return 1
  filename=$(printf '%s\n' "$entry" | sed -n 's/^Filename: //p')
  sha=$(printf '%s\n' "$entry" | sed -n 's/^SHA256: //p')
  [ -n "$filename" ] || return 1
  step "downloading $filename"
  local deb="$WORK_DIR/$(basename "$filename")"
  curl -fsSL -m 600 -o "$deb.tmp" "$base/$filename" || return 1
  echo "$sha  $deb.tmp" | sha256sum -c --quiet - || { rm -f "$deb.tmp"; die "checksum mismatch for $filename"; }
  mv "$deb.tmp" "$deb"
  rm -rf "$WORK_DIR/etcd-deb" && dpkg-deb -x "$deb" "$WORK_DIR/etcd-deb"
  local found="$WORK_DIR/etcd-deb/usr/bin/etcd"
  [ -x "$found" ] || return 1
  # The package must run here and be etcd >= 3.5 (the API server's minimum).
  "$found" --version 2>/dev/null | grep -Eq '^etcd Version: 3\.([5-9]|[1-9][0-9])\.' || return 1
  cp "$found" "$BIN_DIR/etcd.tmp" && mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
}

etcd_from_go() {
  require_go
  step "building etcd v$ETCD_GO_VERSION from go.etcd.io/etcd/server/v3"
  local mod="$WORK_DIR/etcd-wrapper"
  mkdir -p "$mod"
  (
    cd "$mod"
    # server/v3's own go.mod replaces its siblings with ../ paths, which a consumer ignores; requiring the
    # published server module and calling its entry point builds the same binary.
    cat > go.mod <<GOMOD
module asyncrl.dev/etcd-wrapper

go 1.23
GOMOD
    cat > main.go <<'GOSRC'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GOSRC
    go get "go.etcd.io/etcd/server/v3@v$ETCD_GO_VERSION" >&2
    go mod tidy >&2
    go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" .
    mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
  )
}

provision_etcd() {
  if have_bin etcd; then step "etcd present in $BIN_DIR"; return; fi
  if [ "${ASYNCRL_ETCD_SOURCE:-debian}" = debian ] && etcd_from_debian; then
    step "etcd from Debian $ETCD_DEBIAN_SUITE installed"
    return
  fi
  step "Debian etcd-server not available here; falling back to a Go build"
  etcd_from_go
}

# helm's own Makefile stamps the Kubernetes version of its client-go (client-go v0.37 -> 1.37) into the binary;
# a plain `go install` leaves helm's fallback, v1.20, which `helm template` and `helm lint` then assume and
# which is below the chart's kubeVersion (>=1.29). Stamped like a release, `helm template` needs no
# --kube-version. The stamp is recorded next to the binary, so an unstamped helm from an older run is rebuilt.
provision_helm() {
  local stamp_file="$BIN_DIR/.helm-stamp"
  if have_bin helm && [ -s "$stamp_file" ]; then step "helm present in $BIN_DIR ($(cat "$stamp_file"))"; return; fi
  require_go
  local module client_go helm_k8s_major helm_k8s_minor
  module=$(go mod download -json "helm.sh/helm/v3@v$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [ -n "$module" ] && [ -f "$module" ] || die "cannot download helm v$HELM_VERSION's go.mod"
  client_go=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$module")
  [ -n "$client_go" ] || die "helm v$HELM_VERSION's go.mod names no k8s.io/client-go"
  client_go="${client_go#v}"
  helm_k8s_major=$(( ${client_go%%.*} + 1 ))
  helm_k8s_minor="${client_go#*.}"; helm_k8s_minor="${helm_k8s_minor%%.*}"
  step "building helm v$HELM_VERSION (go install helm.sh/helm/v3/cmd/helm), stamped Kubernetes v$helm_k8s_major.$helm_k8s_minor"
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
  local package
  for package in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags="$ldflags -X $package.k8sVersionMajor=$helm_k8s_major -X $package.k8sVersionMinor=$helm_k8s_minor"
  done
  GOBIN="$BIN_DIR" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" >&2
  echo "helm v$HELM_VERSION, Kubernetes v$helm_k8s_major.$helm_k8s_minor" > "$stamp_file"
}

start=$(date +%s)
build_kubernetes
provision_etcd
provision_helm
for b in etcd "${K8S_BINARIES[@]}" helm; do
  have_bin "$b" || die "$b is missing from $BIN_DIR after provisioning"
done
step "control plane ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
echo "$BIN_DIR"
