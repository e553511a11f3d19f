"""SDPA on packed training rows: what the verl backend's default (remove-padding on SDPA) asks of the GPU.

The trainer image has no flash-attn, so the verl backend packs a micro-batch's rows into one sequence and lets
transformers' SDPA path mask them apart: transformers turns the restarting position ids into a block-causal
boolean mask of T x T for the packed length T (up to the token budget, 16,384), and PyTorch's
scaled_dot_product_attention has to take that mask. On CPU the logits are checked equal to unpacked rows
(tests/trainer/backends/test_verl_packing.py); what only a GPU shows is whether the memory-efficient kernel
accepts the mask at these sizes, and at what memory and time. This script measures that with torch alone
(no transformers, vLLM or verl needed), at a Qwen2.5-7B-like attention shape (28 query heads, 4 key/value
heads, head size 128, bf16):

- per packed length: peak CUDA memory and time of one forward + backward through SDPA with the block mask,
  with the kernel PyTorch picks and with the memory-efficient kernel forced;
- the largest difference between the packed output and each row attended alone (bf16 tolerance 2e-2).

    python benchmarks/packed_attention.py [--lengths 4096,8192,16384] [--device cuda]

Prints one line per length and a verdict line; exit code 0 when every length ran and matched. `--device cpu`
with small lengths runs the same code without a GPU (the tests do that, to keep the script working).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

TOLERANCE = 2e-2


@dataclass(frozen=True)
class Measured:
    length: int
    rows: int
    backend: str
    peak_mib: float
    seconds: float
    max_error: float


def row_lengths(total: int, seed: int) -> list[int]:
    """Agent-like rows (long trajectories, short transitions) that add up to `total` tokens."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(rng.randint(2000, 6000) if rng.random() < 0.4 else rng.randint(128, 900))
    lengths[-1] -= sum(lengths) - total
    return [n for n in lengths if n > 0]


def block_causal_mask(lengths: list[int], device: torch.device) -> torch.Tensor:
    """True where a query may attend: earlier-or-same positions of its own row (transformers' packed mask)."""
    row = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    )
    position = torch.arange(len(row), device=device)
    causal = position[:, None] >= position[None, :]
    return (causal & (row[:, None] == row[None, :]))[None, None]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *, efficient: bool
) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = (
        k.repeat_interleave(groups, dim=1),
        v.repeat_interleave(groups, dim=1),
    )  # as transformers repeats kv
    if not efficient:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


def measure(
    length: int, *, device: torch.device, heads: int, kv_heads: int, head_dim: int, efficient: bool, seed: int
) -> Measured:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = row_lengths(length, seed)
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def tensor(h: int) -> torch.Tensor:
        return torch.randn(1, h, length, head_dim, generator=generator).to(device=device, dtype=dtype)

    q, k, v = (
        tensor(heads).requires_grad_(),
        tensor(kv_heads).requires_grad_(),
        tensor(kv_heads).requires_grad_(),
    )
    mask = block_causal_mask(lengths, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    out = attention(q, k, v, mask, efficient=efficient)
    out.float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    with torch.no_grad():  # each row alone, causal: what the packed output must equal
        error, start = 0.0, 0
        for n in lengths[:8]:
            part = slice(start, start + n)
            alone = attention(q[:, :, part], k[:, :, part], v[:, :, part], None, efficient=False)
            error = max(error, float((out[:, :, part].float() - alone.float()).abs().max()))
            start += n
    return Measured(
        length=length,
        rows=len(lengths),
        backend="efficient (forced)" if efficient else "default",
        peak_mib=peak,
        seconds=seconds,
        max_error=error,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--lengths", default="4096,8192,16384", help="packed lengths (tokens), comma-separated"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--heads", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("packed_attention: no CUDA device here (use --device cpu for a small dry run)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {name}")
    failures = []
    for length in (int(text) for text in args.lengths.split(",")):
        for efficient in (False, True) if device.type == "cuda" else (False,):
            try:
                m = measure(
                    length,
                    device=device,
                    heads=args.heads,
                    kv_heads=args.kv_heads,
                    head_dim=args.head_dim,
                    efficient=efficient,
                    seed=args.seed,
                )
            except (RuntimeError, torch.cuda.OutOfMemoryError) as error:  # OOM, or no kernel takes the mask
                failures.append(f"{length} tokens, {'efficient' if efficient else 'default'}: {error}")
                print(f"length {length:6d}  {'efficient' if efficient else 'default':18s}  FAILED: {error}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            line = (
                f"length {m.length:6d}  rows {m.rows:3d}  {m.backend:18s}  peak {m.peak_mib:9.1f} MiB  "
                f"fwd+bwd {m.seconds * 1000:8.1f} ms  max |packed - alone| {m.max_error:.2e}"
            )
            print(line)
            if m.max_error > TOLERANCE:
                failures.append(f"{length} tokens, {m.backend}: packed rows differ by {m.max_error:.2e}")
    verdict = "MET" if not failures else "NOT MET"
    print(f"target packed SDPA runs and matches unpacked rows at every length: {verdict}")
    for failure in failures:
        print(f"  {failure}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
