#!/usr/bin/env bash
# GPU smoke run of the verl backend: `--steps` (default 3) async steps end to end on one GPU, with a small
# model created locally (no download). Prints the six window metrics and step times per step.
#
#   benchmarks/gpu_smoke.sh [--work-dir DIR] [--steps N] [--timeout-seconds S]
#   benchmarks/gpu_smoke.sh --packed-attention-only    # torch + a GPU only: SDPA on packed rows (below)
#
# First, always: benchmarks/packed_attention.py, the training attention the verl backend's defaults use (SDPA
# on packed rows, 4k-16k tokens): it needs only torch and a GPU, so it runs even where vLLM and verl do not.
#
# Needs an NVIDIA GPU and a Python with this checkout installed as '.[trainer,gpu]' (PYTHON, default
# .venv/bin/python, else python3). Not part of `make test`: CI machines have no GPU. See benchmarks/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_smoke: no NVIDIA GPU here (nvidia-smi -L failed); this check needs one" >&2
  exit 2
fi
nvidia-smi -L
echo "== SDPA on packed training rows (benchmarks/packed_attention.py)"
"$PYTHON" benchmarks/packed_attention.py || packed_failed=1
if [[ "${1:-}" == "--packed-attention-only" ]]; then
  exit "${packed_failed:-0}"
fi
if ! "$PYTHON" -c "import asyncrl, verl, vllm, torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "gpu_smoke: $PYTHON lacks asyncrl, verl, vllm or CUDA torch; install it with" >&2
  echo "  $PYTHON -m pip install -e '.[trainer,gpu]' --constraint trainer_image/constraints.txt" >&2
  exit 2
fi
"$PYTHON" -c "import torch, verl, vllm; print(f'torch {torch.__version__}, verl {verl.__version__}, vllm {vllm.__version__}')"
"$PYTHON" benchmarks/gpu_smoke.py "$@" || exit $?
exit "${packed_failed:-0}"
