#!/usr/bin/env bash
# Build the project's container images on this machine, with no image registry: a Debian base made with
# debootstrap, a Python base made from it, then operator/Dockerfile, gateway_image/Dockerfile and
# trainer_image/Dockerfile.cpu built unchanged on that base (`--build-arg BASE_IMAGE=...`) and saved as
# tarballs (`docker save`), which the node's containerd imports (`ctr -n k8s.io images import`).
#
# It runs its own dockerd (and containerd) with their own directories and socket, never the system's, and
# stops them when it ends, unless a dockerd already answered on that socket (then it is reused and left
# running). Docker Engine, containerd, runc and debootstrap are installed with apt when missing (as root).
#
# Everything is cached under the cache directory, keyed by a hash of each image's inputs: the Dockerfile,
# the ignore rules (.dockerignore, <Dockerfile>.dockerignore), every file its COPY instructions take from
# the repository (less what the ignore files keep out) and the base image's ID. The hash is the image's label asyncrl.dev/inputs and the stamp
# beside its tarball; a second run with nothing changed builds and saves nothing.
#   ASYNCRL_CACHE_DIR       cache root (default ~/.cache/asyncrl): docker/ (the daemon's data, the bases'
#                           build files) and images/ (the tarballs, their stamps, images.json)
#   ASYNCRL_DEBIAN_MIRROR   Debian mirror for debootstrap and apt in the bases (default
#                           http://deb.debian.org/debian)
#   ASYNCRL_IMAGES          which images, space-separated (default "operator gateway trainer-cpu")
#   ASYNCRL_CA_BUNDLE       CA bundle copied into the Python base, whose PIP_CERT, REQUESTS_CA_BUNDLE and
#                           SSL_CERT_FILE name it (default /etc/ssl/certs/ca-certificates.crt: this
#                           machine's, which trusts its TLS proxy)
#   ASYNCRL_KEEP_DOCKERD    1: leave the dockerd this run started running, to `docker run` the images with
#                           DOCKER_HOST=unix:///run/asyncrl-images/docker.sock (default: stop it at the end)
# Progress goes to stderr; the last line of output (stdout) is the directory holding the image tarballs
# (operator.tar, gateway.tar, trainer-cpu.tar) and images.json (tag, tarball, inputs hash, base image ID,
# size in bytes and build seconds of each image's last build).
set -euo pipefail

CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
MIRROR="${ASYNCRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SELECTED="${ASYNCRL_IMAGES:-operator gateway trainer-cpu}"
KEEP_DOCKERD="${ASYNCRL_KEEP_DOCKERD:-}"
CA_BUNDLE="${ASYNCRL_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKER_DIR="$CACHE_DIR/docker"
IMAGES_DIR="$CACHE_DIR/images"
# The daemons' sockets and exec roots: short paths, since a unix socket's path is limited to 107 bytes.
RUN_DIR="/run/asyncrl-images"
SOCK="$RUN_DIR/docker.sock"
CONTAINERD_SOCK="$RUN_DIR/containerd.sock"
# Debian's client, of the same release as its daemon (a newer one elsewhere on PATH is not needed).
DOCKER=/usr/bin/docker
DEBIAN_IMAGE=asyncrl.local/debian:bookworm
PYTHON_IMAGE=asyncrl.local/python:3.11-bookworm
INPUTS_LABEL=asyncrl.dev/inputs
ALL_IMAGES="operator gateway trainer-cpu"
export DOCKER_HOST="unix://$SOCK" DOCKER_BUILDKIT=0
unset DOCKER_CONTEXT

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-images: error: %s\n' "$*" >&2; exit 1; }

image_dockerfile() {
  case "$1" in
    operator) echo operator/Dockerfile ;;
    gateway) echo gateway_image/Dockerfile ;;
    trainer-cpu) echo trainer_image/Dockerfile.cpu ;;
    *) die "unknown image '$1' in ASYNCRL_IMAGES (known: $ALL_IMAGES)" ;;
  esac
}
image_tag() { echo "ghcr.io/asyncrl/$1:0.1.0"; }

for name in $SELECTED; do image_dockerfile "$name" >/dev/null; done

# --- tools -----------------------------------------------------------------------------------------------

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
[ -x "$DOCKER" ] || missing+=(docker.io)
command -v containerd >/dev/null 2>&1 || missing+=(containerd)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
command -v gpgv >/dev/null 2>&1 || missing+=(gpgv)
[ -f "$CA_BUNDLE" ] || [ "$CA_BUNDLE" != /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: run as root, or install them with apt"
  read -r -a missing <<<"$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')"
  step "installing ${missing[*]} (apt)"
  # The package would start the system's Docker service; a policy-rc.d that denies it keeps it stopped.
  added_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    added_policy=1
  fi
  status=0
  { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
         "${missing[@]}"; } >&2 || status=$?
  [ -z "$added_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ "$status" -eq 0 ] || die "apt-get install ${missing[*]} failed (see above)"
fi
[ -f "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE (set ASYNCRL_CA_BUNDLE)"

# --- a private dockerd -----------------------------------------------------------------------------------

DOCKERD_PID=""
CONTAINERD_PID=""
stop_daemons() {
  # Only what this run started, by the PIDs it got.
  local pid
  for pid in $DOCKERD_PID $CONTAINERD_PID; do
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$DOCKERD_PID" ]; then
    rm -f "$RUN_DIR/dockerd.pid" "$RUN_DIR/containerd.pid" "$SOCK" "$CONTAINERD_SOCK" "$CONTAINERD_SOCK.ttrpc"
    step "stopped the private dockerd (pid $DOCKERD_PID) and containerd (pid $CONTAINERD_PID)"
  fi
  DOCKERD_PID=""
  CONTAINERD_PID=""
}
trap stop_daemons EXIT
trap 'exit 130' INT TERM

mkdir -p "$RUN_DIR" "$DOCKER_DIR/data" "$DOCKER_DIR/containerd" "$IMAGES_DIR"
if "$DOCKER" version >/dev/null 2>&1; then
  step "reusing the dockerd that answers on $SOCK"
else
  for pidfile in "$RUN_DIR/dockerd.pid" "$RUN_DIR/containerd.pid"; do
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      die "pid $(cat "$pidfile") ($pidfile) is alive but $SOCK does not answer; stop it and run again"
    fi
    rm -f "$pidfile"
  done
  rm -f "$SOCK" "$CONTAINERD_SOCK"
  step "starting a private containerd and dockerd on $SOCK (data in $DOCKER_DIR)"
  # containerd of its own (dockerd would otherwise use a system containerd found at the default socket),
  # with no CRI plugin: Docker only needs its image and task services.
  cat >"$DOCKER_DIR/containerd.toml" <<EOF
version = 2
root = "$DOCKER_DIR/containerd"
state = "$RUN_DIR/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$CONTAINERD_SOCK"
EOF
  containerd --config "$DOCKER_DIR/containerd.toml" >"$DOCKER_DIR/containerd.log" 2>&1 &
  CONTAINERD_PID=$!
  echo "$CONTAINERD_PID" >"$RUN_DIR/containerd.pid"
  for _ in $(seq 60); do [ -S "$CONTAINERD_SOCK" ] && break; sleep 0.5; done
  [ -S "$CONTAINERD_SOCK" ] || die "containerd did not start (log: $DOCKER_DIR/containerd.log)"
  # No bridge or iptables rules on this machine: builds and containers use the host's network.
  dockerd --iptables=false --ip6tables=false --bridge=none \
    --data-root "$DOCKER_DIR/data" --exec-root "$RUN_DIR/exec" \
    --containerd "$CONTAINERD_SOCK" -H "unix://$SOCK" --pidfile "$RUN_DIR/dockerd.pid" \
    >"$DOCKER_DIR/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 120); do
    "$DOCKER" version >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || die "dockerd exited (log: $DOCKER_DIR/dockerd.log)"
    sleep 0.5
  done
  "$DOCKER" version >/dev/null 2>&1 || die "dockerd does not answer on $SOCK (log: $DOCKER_DIR/dockerd.log)"
fi

image_id() { "$DOCKER" image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }
image_label() { "$DOCKER" image inspect -f "{{index .Config.Labels \"$INPUTS_LABEL\"}}" "$1" 2>/dev/null || true; }
human() { awk -v b="$1" 'BEGIN { split("B KB MB GB TB", u); i = 1; while (b >= 1000 && i < 5) { b /= 1000; i++ } printf "%.1f %s", b, u[i] }'; }

# Build `tag` from `dockerfile` in `context` unless it already carries `hash`; prints the seconds it took
# (nothing when it was up to date).
build() {
  local tag=$1 dockerfile=$2 context=$3 hash=$4
  shift 4
  if [ "$(image_label "$tag")" = "$hash" ]; then
    step "$tag is up to date (inputs $hash)"
    return
  fi
  step "building $tag from $dockerfile (inputs $hash)"
  local start
  start=$(date +%s)
  "$DOCKER" build --network host --label "$INPUTS_LABEL=$hash" -f "$dockerfile" -t "$tag" "$@" "$context" >&2 \
    || die "building $tag failed (see above)"
  echo $(( $(date +%s) - start ))
}

# --- the Debian base -------------------------------------------------------------------------------------

if [ -n "$(image_id "$DEBIAN_IMAGE")" ]; then
  step "$DEBIAN_IMAGE present"
else
  step "debootstrap --variant=minbase bookworm from $MIRROR"
  start=$(date +%s)
  rootfs="$DOCKER_DIR/rootfs.tmp"
  rm -rf "$rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >&2 || die "debootstrap failed (see above)"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar --numeric-owner -C "$rootfs" -c . \
    | "$DOCKER" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null \
    || die "docker import of the Debian root filesystem failed"
  rm -rf "$rootfs"
  step "$DEBIAN_IMAGE imported ($(( $(date +%s) - start ))s)"
fi

# --- the Python base -------------------------------------------------------------------------------------

# What python:3.11-slim gives the Dockerfiles (python and python3 on PATH, venv, pip, groupadd/useradd), from
# Debian's packages, plus this machine's CA bundle for pip (local plumbing: it is not in any Dockerfile).
base_dir="$DOCKER_DIR/python-base"
mkdir -p "$base_dir"
cp "$CA_BUNDLE" "$base_dir/ca-bundle.crt"
cat >"$base_dir/Dockerfile" <<EOF
FROM $DEBIAN_IMAGE
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \\
    && apt-get install -y --no-install-recommends \\
       python3 python3-venv python3-pip python-is-python3 ca-certificates passwd \\
    && rm -rf /var/lib/apt/lists/*
COPY ca-bundle.crt /usr/local/share/asyncrl/ca-bundle.crt
ENV PIP_CERT=/usr/local/share/asyncrl/ca-bundle.crt \\
    REQUESTS_CA_BUNDLE=/usr/local/share/asyncrl/ca-bundle.crt \\
    SSL_CERT_FILE=/usr/local/share/asyncrl/ca-bundle.crt \\
    PIP_DEFAULT_TIMEOUT=180
CMD ["python3"]
EOF
base_hash=$({ sha256sum "$base_dir/Dockerfile" "$base_dir/ca-bundle.crt" | cut -d' ' -f1
              printf 'base %s\n' "$(image_id "$DEBIAN_IMAGE")"; } | sha256sum | cut -d' ' -f1)
seconds=$(build "$PYTHON_IMAGE" "$base_dir/Dockerfile" "$base_dir" "$base_hash")
[ -z "$seconds" ] || step "$PYTHON_IMAGE built in ${seconds}s"
PYTHON_IMAGE_ID=$(image_id "$PYTHON_IMAGE")

# --- the project's images --------------------------------------------------------------------------------

# The context paths that a Dockerfile's COPY/ADD instructions take (not those from another stage).
copied_sources() {
  awk 'toupper($1) == "COPY" || toupper($1) == "ADD" {
         n = 0; other_stage = 0
         for (i = 2; i <= NF; i++) { if ($i ~ /^--from/) other_stage = 1; else if ($i !~ /^--/) w[++n] = $i }
         if (!other_stage) for (i = 1; i < n; i++) print w[i]
       }' "$REPO/$1"
}

# The inputs hash of the image built from `dockerfile` on the base `base_id`: sha256 of the sha256sum lines
# (sorted by path) of the Dockerfile, its ignore files and every file its COPY sources hold, less what every
# ignore file keeps out (bytecode, egg-info, the test harness src/asyncrl/testing), then `base <base_id>`.
# tests/images/test_built_images.py computes the same.
inputs_hash() {
  local dockerfile=$1 base_id=$2
  (
    cd "$REPO"
    {
      printf '%s\n' "$dockerfile" .dockerignore
      [ ! -f "$dockerfile.dockerignore" ] || printf '%s\n' "$dockerfile.dockerignore"
      # shellcheck disable=SC2046
      find $(copied_sources "$dockerfile") -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
        ! -name '*.egg-info' ! -path '*.egg-info/*' ! -path 'src/asyncrl/testing/*'
    } | LC_ALL=C sort -u | tr '\n' '\0' | xargs -0 sha256sum
    printf 'base %s\n' "$base_id"
  ) | sha256sum | cut -d' ' -f1
}

for name in $SELECTED; do
  dockerfile=$(image_dockerfile "$name")
  tag=$(image_tag "$name")
  hash=$(inputs_hash "$dockerfile" "$PYTHON_IMAGE_ID")
  seconds=$(build "$tag" "$REPO/$dockerfile" "$REPO" "$hash" --build-arg "BASE_IMAGE=$PYTHON_IMAGE")
  if [ -n "$seconds" ]; then
    echo "$seconds" >"$IMAGES_DIR/$name.build-seconds"
    step "$tag built in ${seconds}s"
  fi
  tarball="$IMAGES_DIR/$name.tar"
  if [ -f "$tarball" ] && [ "$(cat "$IMAGES_DIR/$name.inputs" 2>/dev/null)" = "$hash" ]; then
    step "$tarball is up to date"
  else
    step "saving $tag to $tarball"
    rm -f "$IMAGES_DIR/$name.inputs"
    "$DOCKER" save -o "$tarball.tmp" "$tag" || die "docker save $tag failed"
    chmod 0644 "$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    echo "$hash" >"$IMAGES_DIR/$name.inputs"
  fi
  size=$("$DOCKER" image inspect -f '{{.Size}}' "$tag")
  build_seconds=$(cat "$IMAGES_DIR/$name.build-seconds" 2>/dev/null || echo null)
  printf '{"tag": "%s", "tarball": "%s", "inputs": "%s", "base_image_id": "%s", "size_bytes": %s, "build_seconds": %s}\n' \
    "$tag" "$tarball" "$hash" "$PYTHON_IMAGE_ID" "$size" "$build_seconds" >"$IMAGES_DIR/$name.json"
done

# What rebuilds left behind (the images the tags moved from, the build stages) is several GB a time; the
# build cache it held only serves inputs that are gone.
if [ -n "$("$DOCKER" images -q -f dangling=true)" ]; then
  step "removing dangling images: $("$DOCKER" image prune -f | tail -n 1)"
fi

# images.json: every image built so far (this run's selection or an earlier one's), in a fixed order.
{
  echo "{"
  first=1
  for name in $ALL_IMAGES; do
    if [ ! -f "$IMAGES_DIR/$name.json" ] || [ ! -f "$IMAGES_DIR/$name.tar" ]; then continue; fi
    [ -n "$first" ] || echo ","
    printf '  "%s": %s' "$name" "$(cat "$IMAGES_DIR/$name.json")"
    first=""
  done
  printf '\n}\n'
} >"$IMAGES_DIR/images.json"

for name in $SELECTED; do
  size=$(sed -n 's/.*"size_bytes": \([0-9]*\).*/\1/p' "$IMAGES_DIR/$name.json")
  step "$(image_tag "$name"): $(human "$size") ($size bytes), last build $(cat "$IMAGES_DIR/$name.build-seconds" 2>/dev/null || echo '?')s"
done
if [ -n "$KEEP_DOCKERD" ] && [ -n "$DOCKERD_PID" ]; then
  step "leaving dockerd (pid $DOCKERD_PID) and containerd (pid $CONTAINERD_PID) running: DOCKER_HOST=$DOCKER_HOST"
  DOCKERD_PID=""
  CONTAINERD_PID=""
fi
stop_daemons
echo "$IMAGES_DIR"
