#!/usr/bin/env bash
# Provision a real Kubernetes node for tests (asyncrl.testing.node): kubelet, kube-scheduler and kube-proxy
# built like the control plane (scripts/provision-k8s.sh builds them, with the control plane, from the same
# wrapper module), CoreDNS and crictl built from their Go modules, Debian's containerd, runc, CNI plugins,
# iptables and conntrack, and two images made here, since no registry is reachable: the sandbox image
# (a static C `pause`, scripts/node/pause.c) and a busybox image (Debian's busybox-static) for smoke tests.
#
# Everything goes into a cache outside the repository; a second run finds it and does nothing.
#   ASYNCRL_CACHE_DIR         cache root (default ~/.cache/asyncrl)
#   ASYNCRL_K8S_VERSION       Kubernetes release (default 1.36.3; passed on to provision-k8s.sh)
#   ASYNCRL_COREDNS_VERSION   CoreDNS release (default 1.15.0)
#   ASYNCRL_CRICTL_VERSION    cri-tools release (default 1.37.0)
# Packages are installed with apt when missing (as root; their services are not started). The last line of
# output is an env file (KEY=VALUE lines, shell-sourceable) naming every binary and image tarball; the
# harness reads it (asyncrl.testing.node).
set -euo pipefail

HERE="${BASH_SOURCE[0]%/*}"
[ "$HERE" != "${BASH_SOURCE[0]}" ] || HERE=.
REPO="$(cd "$HERE/.." && pwd)"
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
COREDNS_VERSION="${ASYNCRL_COREDNS_VERSION:-1.15.0}"
COREDNS_VERSION="${COREDNS_VERSION#v}"
CRICTL_VERSION="${ASYNCRL_CRICTL_VERSION:-1.37.0}"
CRICTL_VERSION="${CRICTL_VERSION#v}"
NODE_DIR="$CACHE_DIR/node"
IMAGES_DIR="$NODE_DIR/images"
ENV_FILE="$NODE_DIR/node.env"
COREDNS_BIN="$CACHE_DIR/coredns/v$COREDNS_VERSION/bin/coredns"
CRICTL_BIN="$CACHE_DIR/cri-tools/v$CRICTL_VERSION/bin/crictl"
CNI_BIN_DIR=/usr/lib/cni
PAUSE_IMAGE=asyncrl.local/pause:3.10
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-node: error: %s\n' "$*" >&2; exit 1; }
require_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= 1.26 (https://go.dev/dl or your package manager) and run again"
}
timed() {  # timed <label> <command...>: run it and report how long it took
  local label=$1 start
  shift
  start=$(date +%s)
  "$@"
  step "$label: $(( $(date +%s) - start ))s"
}

# --- packages --------------------------------------------------------------------------------------------

install_packages() {
  local missing=()
  command -v containerd >/dev/null 2>&1 && command -v ctr >/dev/null 2>&1 || missing+=(containerd)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  [ -x "$CNI_BIN_DIR/bridge" ] && [ -x "$CNI_BIN_DIR/host-local" ] && [ -x "$CNI_BIN_DIR/portmap" ] \
    && [ -x "$CNI_BIN_DIR/loopback" ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v conntrack >/dev/null 2>&1 || missing+=(conntrack)
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
  command -v gcc >/dev/null 2>&1 || missing+=(gcc)
  [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -f /usr/lib/aarch64-linux-gnu/libc.a ] || missing+=(libc6-dev)
  command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  if [ ${#missing[@]} -eq 0 ]; then step "containerd, runc, CNI plugins, iptables, conntrack, busybox present"; return; fi
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: run as root, or install them with apt"
  step "installing ${missing[*]} (apt)"
  # The containerd package would start the system's service; a policy-rc.d that denies it keeps it stopped
  # (the node runs a containerd of its own, with its own config, directories and socket).
  local added_policy="" status=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    added_policy=1
  fi
  { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      "${missing[@]}" \
    || { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
         --no-install-recommends "${missing[@]}"; }; } >&2 || status=$?
  [ -z "$added_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ "$status" -eq 0 ] || die "apt-get install ${missing[*]} failed (see above)"
}

# --- Go builds -------------------------------------------------------------------------------------------

# kubelet, kube-scheduler and kube-proxy come from provision-k8s.sh's wrapper module, with its version stamp;
# it builds the control plane too when that is missing. Its last output line is the bin directory.
provision_kubernetes() {
  K8S_BIN_DIR=$(ASYNCRL_K8S_EXTRA_BINARIES="kubelet kube-scheduler kube-proxy" "$REPO/scripts/provision-k8s.sh" | tail -n 1)
  local b
  for b in kubelet kube-scheduler kube-proxy; do
    [ -x "$K8S_BIN_DIR/$b" ] || die "$b is missing from $K8S_BIN_DIR after scripts/provision-k8s.sh"
  done
}

# go_install_module <module> <version> <package> <binary path> <ldflags>: `go install` of a module with no
# replace directives builds exactly its go.sum graph.
go_install_module() {
  local module=$1 version=$2 package=$3 target=$4 ldflags=$5
  local tmp="${target%/*}/.gobin.tmp"
  require_go
  mkdir -p "${target%/*}" "$GOMODCACHE" "$GOCACHE"
  go mod download -json "$module@v$version" >/dev/null \
    || die "could not download $module@v$version from the Go module proxy ($(go env GOPROXY))"
  rm -rf "$tmp"
  GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "$package@v$version" >&2 \
    || die "building $package@v$version failed (see above)"
  mv "$tmp/${package##*/}" "$target"
  rmdir "$tmp"
}

provision_coredns() {
  if [ -x "$COREDNS_BIN" ]; then step "CoreDNS v$COREDNS_VERSION present"; return; fi
  step "building CoreDNS v$COREDNS_VERSION (go install github.com/coredns/coredns)"
  go_install_module github.com/coredns/coredns "$COREDNS_VERSION" github.com/coredns/coredns "$COREDNS_BIN" \
    "-s -w -X github.com/coredns/coredns/coremain.GitCommit=v$COREDNS_VERSION"
}

provision_crictl() {
  if [ -x "$CRICTL_BIN" ]; then step "crictl v$CRICTL_VERSION present"; return; fi
  step "building crictl v$CRICTL_VERSION (go install sigs.k8s.io/cri-tools/cmd/crictl)"
  go_install_module sigs.k8s.io/cri-tools "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl "$CRICTL_BIN" \
    "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRICTL_VERSION"
}

# --- images ----------------------------------------------------------------------------------------------

# pack_image <name> <rootfs> <tarball> <ociimage args...>: the tarball and, beside it, its stamp.
pack_image() {
  local name=$1 rootfs=$2 tarball=$3
  shift 3
  PYTHONPATH="$REPO/src" python3 -m asyncrl.testing.ociimage --rootfs "$rootfs" --name "$name" \
    --output "$tarball" "$@" >/dev/null || die "packing $name from $rootfs failed (see above)"
}

provision_pause_image() {
  local tarball="$IMAGES_DIR/pause.tar" stamp
  stamp="$(sha256sum "$HERE/node/pause.c" "$REPO/src/asyncrl/testing/ociimage.py" | sha256sum | cut -c1-16) $(gcc -dumpfullversion)"
  if [ -s "$tarball" ] && [ "$(cat "$tarball.stamp" 2>/dev/null)" = "$stamp" ]; then
    step "$PAUSE_IMAGE present ($tarball)"; return
  fi
  step "building $PAUSE_IMAGE (gcc -static scripts/node/pause.c)"
  local rootfs="$IMAGES_DIR/pause-rootfs"
  rm -rf "$rootfs" && mkdir -p "$rootfs"
  gcc -static -O2 -Wall -Wextra -o "$rootfs/pause" "$HERE/node/pause.c" >&2 || die "compiling pause.c failed"
  strip "$rootfs/pause" 2>/dev/null || true
  "$rootfs/pause" -v >/dev/null || die "the pause binary does not run"
  pack_image "$PAUSE_IMAGE" "$rootfs" "$tarball" --entrypoint /pause --user 65535:65535
  rm -rf "$rootfs"
  echo "$stamp" > "$tarball.stamp"
}

provision_busybox_image() {
  local tarball="$IMAGES_DIR/busybox.tar" version stamp
  version=$(/bin/busybox 2>&1 | sed -n '1s/^BusyBox v\([0-9.]*\).*/\1/p')
  [ -n "$version" ] || die "cannot read /bin/busybox's version"
  BUSYBOX_IMAGE="asyncrl.local/busybox:$version"
  stamp="$(sha256sum /bin/busybox "$REPO/src/asyncrl/testing/ociimage.py" | sha256sum | cut -c1-16) $version"
  if [ -s "$tarball" ] && [ "$(cat "$tarball.stamp" 2>/dev/null)" = "$stamp" ]; then
    step "$BUSYBOX_IMAGE present ($tarball)"; return
  fi
  step "building $BUSYBOX_IMAGE from Debian's busybox-static"
  local rootfs="$IMAGES_DIR/busybox-rootfs" applet
  rm -rf "$rootfs" && mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/root" "$rootfs/var/www"
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
  done
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  pack_image "$BUSYBOX_IMAGE" "$rootfs" "$tarball" --cmd sh --env PATH=/bin
  rm -rf "$rootfs"
  echo "$stamp" > "$tarball.stamp"
}

write_env_file() {
  local tmp="$ENV_FILE.tmp"
  {
    echo "# Written by scripts/provision-node.sh; read by asyncrl.testing.node."
    echo "ASYNCRL_NODE_K8S_BIN_DIR=$K8S_BIN_DIR"
    echo "ASYNCRL_NODE_COREDNS=$COREDNS_BIN"
    echo "ASYNCRL_NODE_CRICTL=$CRICTL_BIN"
    echo "ASYNCRL_NODE_CONTAINERD=$(command -v containerd)"
    echo "ASYNCRL_NODE_CTR=$(command -v ctr)"
    echo "ASYNCRL_NODE_RUNC=$(command -v runc)"
    echo "ASYNCRL_NODE_CNI_BIN_DIR=$CNI_BIN_DIR"
    echo "ASYNCRL_NODE_PAUSE_IMAGE=$PAUSE_IMAGE"
    echo "ASYNCRL_NODE_PAUSE_TAR=$IMAGES_DIR/pause.tar"
    echo "ASYNCRL_NODE_BUSYBOX_IMAGE=$BUSYBOX_IMAGE"
    echo "ASYNCRL_NODE_BUSYBOX_TAR=$IMAGES_DIR/busybox.tar"
  } > "$tmp"
  mv "$tmp" "$ENV_FILE"
}

main() {
  local start
  start=$(date +%s)
  mkdir -p "$NODE_DIR" "$IMAGES_DIR"
  timed "packages" install_packages
  timed "kubernetes binaries" provision_kubernetes
  timed "CoreDNS" provision_coredns
  timed "crictl" provision_crictl
  timed "pause image" provision_pause_image
  timed "busybox image" provision_busybox_image
  write_env_file
  step "node ready ($(( $(date +%s) - start ))s); its tools are named in $ENV_FILE"
  echo "$ENV_FILE"
}

# Sourced (by a test of one step), it only defines the steps.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
