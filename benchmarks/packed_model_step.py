"""Where a packed training step's time goes: the model's attention, the vocabulary, or neither.

Why: on one H200, verl's FSDP actor took 33-45 s for 64 agent rows (132,671 tokens) of a 0.5B model, an
MFU of 1.2-1.7 % (docs/gpu-backend.md). verl packs each micro-batch's rows into one sequence (remove-padding)
and transformers' SDPA path masks the rows apart with a dense T x T block mask, which rules out the flash
kernel; the log-probs then run over the whole vocabulary. This script times, on one micro-batch of agent-like
rows, forward + backward of a Hugging Face model in the shape of Qwen2.5-0.5B (random weights, bf16):

- `packed sdpa`: the rows packed, position ids restarting per row, no mask given (what verl passes): the
  block mask path;
- `rows alone`: each row by itself, causal (no mask: the flash kernel), summed over the rows;
- `packed eager`: the packed rows through transformers' eager attention, for scale (skipped above 8,192);
- `vocabulary`: the LM head and log-softmax over the vocabulary for the packed rows in fp32 (what the
  log-prob and entropy take), forward + backward.

Each is warmed up once and then timed over `--repeats` runs; it prints seconds, tokens per second and the
model FLOP utilisation against `--peak-tflops` (bf16 dense, measured 790 on the H200). The logits of `packed
sdpa` are checked against `rows alone` (bf16 tolerance), so a fast path that mixes rows is caught.

    python benchmarks/packed_model_step.py [--tokens 16384] [--repeats 3] [--device cuda]

`--device cpu --model tiny --tokens 512` runs the same code without a GPU (the tests do, to keep it working).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # verl_actor_gpu.py, beside this file
from verl_actor_gpu import QWEN05_SHAPE  # the model the verl actor trained on the GPU

SHAPES: dict[str, dict[str, Any]] = {
    "qwen0.5b": QWEN05_SHAPE,
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
}
TOLERANCE = 0.1  # bf16 logits of one model, packed and alone


@dataclass(frozen=True)
class Timed:
    name: str
    seconds: float
    tokens: int
    flops: float  # the model's matrix work for forward + backward (6 x parameters x tokens)

    def line(self, peak_tflops: float) -> str:
        mfu = self.flops / self.seconds / (peak_tflops * 1e12) if self.seconds > 0 else 0.0
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.name:<14} {self.seconds * 1000:9.1f} ms  {rate:11,.0f} tokens/s  "
            f"model FLOP utilisation {100 * mfu:5.1f} %"
        )


def row_lengths(total: int, seed: int, *, scale: float) -> list[int]:
    """Agent-like rows (long trajectories, short transitions) adding up to `total` tokens."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        long = rng.random() < 0.4
        lengths.append(max(4, int((rng.randint(2000, 6000) if long else rng.randint(128, 900)) * scale)))
    lengths[-1] -= sum(lengths) - total
    return [n for n in lengths if n > 0]


def build_model(shape: dict[str, Any], device: torch.device, attention: str) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**shape)
    config._attn_implementation = attention
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model: Any = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    return model.to(device=device, dtype=dtype).train()


def timed(run: Callable[[], Any], device: torch.device, repeats: int) -> float:
    run()  # warm-up: kernel selection, allocator, compilation
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def packed_inputs(lengths: list[int], vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (1, sum(lengths)), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids.to(device), positions.to(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=16384, help="the micro-batch's packed length")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="qwen0.5b", choices=sorted(SHAPES))
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "packed_model_step: no CUDA device here (--device cpu --model tiny for a dry run)",
            file=sys.stderr,
        )
        return 2
    shape = SHAPES[args.model]
    scale = 1.0 if args.model == "qwen0.5b" else args.tokens / 16384
    lengths = row_lengths(args.tokens, args.seed, scale=scale)
    ids, positions = packed_inputs(lengths, shape["vocab_size"], device)
    model = build_model(shape, device, "sdpa")
    parameters = sum(p.numel() for p in model.parameters())
    flops = 6.0 * parameters * args.tokens
    print(
        f"{args.model}: {parameters / 1e6:.0f}M parameters, {args.tokens} tokens in {len(lengths)} rows "
        f"(longest {max(lengths)}), device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}"
    )

    def packed_step(m: Any) -> Callable[[], Any]:
        def run() -> Any:
            m.zero_grad(set_to_none=True)
            logits = m(input_ids=ids, position_ids=positions, use_cache=False).logits
            logits.float().logsumexp(-1).mean().backward()
            return logits

        return run

    def rows_alone() -> None:
        model.zero_grad(set_to_none=True)
        start = 0
        for n in lengths:
            part = ids[:, start : start + n]
            logits = model(input_ids=part, use_cache=False).logits
            logits.float().logsumexp(-1).mean().backward()
            start += n

    hidden = torch.randn(
        1, args.tokens, shape["hidden_size"], device=device, dtype=next(model.parameters()).dtype
    )
    targets = ids[0]

    def vocabulary() -> None:
        h = hidden.detach().requires_grad_()
        logits = model.lm_head(h).float()[0]
        logp = torch.log_softmax(logits, dim=-1)
        token = logp.gather(1, targets[:, None]).sum()
        entropy = -(logp.exp() * logp).sum()
        loss: torch.Tensor = token + entropy
        loss.backward()  # type: ignore[no-untyped-call]

    results = [
        Timed("packed sdpa", timed(packed_step(model), device, args.repeats), args.tokens, flops),
        Timed("rows alone", timed(rows_alone, device, args.repeats), args.tokens, flops),
    ]
    if args.tokens <= 8192:
        eager = build_model(shape, device, "eager")
        eager.load_state_dict(model.state_dict())
        results.append(
            Timed("packed eager", timed(packed_step(eager), device, args.repeats), args.tokens, flops)
        )
        del eager
    vocab_flops = 6.0 * shape["hidden_size"] * shape["vocab_size"] * args.tokens
    results.append(Timed("vocabulary", timed(vocabulary, device, args.repeats), args.tokens, vocab_flops))
    for result in results:
        print(result.line(args.peak_tflops))

    with torch.no_grad():  # the packed path gives each row its own logits
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits.float()
        gap, start = 0.0, 0
        for n in lengths[:6]:
            alone = model(input_ids=ids[:, start : start + n], use_cache=False).logits.float()
            gap = max(gap, float((packed[:, start : start + n] - alone).abs().max()))
            start += n
    ok = gap < TOLERANCE
    verdict = "MET" if ok else "NOT MET"
    print(f"packed sdpa logits vs rows alone: max gap {gap:.3g} (tolerance {TOLERANCE}): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
