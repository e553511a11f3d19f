"""verl's FSDP actor on one GPU, fed by asyncrl: init, log-probs and updates (the backend's training half).

What it runs (one process, torch.distributed with world size 1)
    The config is the one the verl backend composes for `examples/run-gpu.yaml` (asyncrl's own
    `compose_verl_config`, verl's Hydra files), with the model path pointed at a model made here: random
    weights in Qwen2.5-0.5B's shape (152k vocabulary, 24 layers, GQA 14/2), the reference backend's byte
    tokenizer. verl's own `ActorRolloutRefWorker` (role `actor`, the class the backend's Ray workers run) does
    `init_model()`: its FSDP engine, optimizer and LR scheduler. The rows are agent-like (prompts of 200-1,500
    tokens, responses of 100-2,048 with tool output masked out, trainBatchSize x samplesPerPrompt of them)
    turned into verl's records by asyncrl's `build_trajectory_batch`, as the backend puts them into
    TransferQueue; each worker call gets them as TransferQueue's dispatch hands them over (the fields plus
    the call's extra info as non-tensor data). Then, per update: `compute_log_prob` (packed rows, dynamic
    micro-batches at the run's token budget) and `update_actor` with verl's PPO loss and token-level rollout
    correction weights.

What it prints
    Per phase: seconds and peak GPU memory; per update: verl's loss, grad norm, LR and MFU; the largest gap
    between the engine's packed log-probs and a plain Hugging Face forward of each row alone (the same
    weights); and whether the policy moved after an update. A JSON summary goes to --out. Exit code 0 only
    when every check holds: init and each call ran, finite loss and grad norm, packed log-probs within bf16
    tolerance of the unpacked forward, and log-probs that change after an update.

What it does not run
    vLLM (its wheel does not fit a device call here), Ray (not installed there: `--ray-stub` stands in for its
    import surface only; no Ray call is made on this path) and TransferQueue's server. Those parts run on CPU
    in the tests (docs/gpu-backend.md). verl registers its FSDP engine for CUDA (and NPU) only, so this needs
    a GPU; its pure parts (the rows, the response cut) are tested on CPU (tests/benchmarks/).

    python benchmarks/verl_actor_gpu.py [--model qwen0.5b|tiny] [--updates 2] [--out FILE] [--ray-stub]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RUN_FILE = REPO / "examples" / "run-gpu.yaml"
# bf16 log-probs of the same weights, packed and alone: kernels differ, values agree to about 1e-2 nats.
LOGPROB_TOLERANCE = 0.1

QWEN05_SHAPE = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)
TINY_SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model(directory: Path, shape: dict[str, Any]) -> None:
    """Random Qwen2 weights of `shape` and the byte tokenizer (nothing downloaded)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncrl.testing.tiny_model import save_tiny_model

    save_tiny_model(directory)  # the tokenizer and generation config; the weights are replaced below
    for stale in directory.glob("*.safetensors"):
        stale.unlink()
    torch.manual_seed(0)
    config = Qwen2Config(**shape)
    config.dtype = torch.bfloat16  # written to config.json: verl and vLLM load the weights as bf16
    model: Any = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)


def compose(model_dir: Path) -> Any:
    import yaml

    from asyncrl.api import load_run
    from asyncrl.trainer.backends.verl.config import compose_verl_config, verl_settings

    manifest = yaml.safe_load(RUN_FILE.read_text())
    manifest["spec"]["model"]["path"] = str(model_dir)
    run = load_run(manifest)
    return compose_verl_config(verl_settings(run, checkpoint_dir=model_dir.parent / "checkpoints"))


def agent_rows(count: int, group_size: int, vocab: int, seed: int, *, scale: float) -> list[Any]:
    """Agent-like rows: prompt 200-1,500 tokens, response 100-2,048 with tool output spans at mask 0."""
    from asyncrl.trainer.rows import TrainingRow

    rng = random.Random(seed)
    rows = []
    for i in range(count):
        group = i // group_size
        prompt = [rng.randrange(1, vocab) for _ in range(int(rng.randint(200, 1500) * scale) or 4)]
        length = int(rng.randint(100, 2048) * scale) or 4
        response = [rng.randrange(1, vocab) for _ in range(length)]
        mask = [1] * length
        if length > 40 and rng.random() < 0.6:  # a tool turn's output inside the trajectory
            start = rng.randrange(5, length // 2)
            for j in range(start, min(length - 5, start + rng.randint(10, max(11, length // 4)))):
                mask[j] = 0
        rows.append(
            TrainingRow(
                rollout_id=f"r{i}",
                group_id=f"g{group}",
                prompt_token_ids=tuple(prompt),
                response_token_ids=tuple(response),
                response_mask=tuple(mask),
                rollout_log_probs=(-2.0,) * length,  # replaced by the actor's own, perturbed, below
                reward=float(rng.random() < 0.5),
                model_version=0,
            )
        )
    return rows


def with_info(fields: Any, info: dict[str, Any]) -> Any:
    """The TensorDict a worker call receives: TransferQueue's fields plus the call's extra info."""
    from verl.utils import tensordict_utils as tu

    for key, value in info.items():
        tu.assign_non_tensor_data(tensor_dict=fields, key=key, val=value)
    return fields


def response_part(nested: Any, fields: Any) -> list[Any]:
    """Per row, the response tokens' log-probs, cut from the engine's per-position output as verl's trainer
    cuts them (`response_from_nested`: position i holds the log-prob of token i + 1)."""
    from verl.workers.utils.padding import response_from_nested

    return list(response_from_nested(nested, fields["response_mask"]).unbind())


def hf_logprobs(model_dir: Path, rows: list[Any], device: str) -> list[Any]:
    """Each row alone through the saved model (same weights, eager HF forward, no packing)."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row.prompt_token_ids + row.response_token_ids], device=device)
            logits = model(input_ids=ids).logits.float()[0]
            logp = torch.log_softmax(logits[:-1], dim=-1)
            targets = ids[0, 1:]
            lp = logp.gather(1, targets[:, None])[:, 0]
            out.append(lp[-len(row.response_token_ids) :].cpu())
    del model
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="qwen0.5b", choices=["qwen0.5b", "tiny"])
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/verl-actor-gpu"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--ray-stub", action="store_true", help="stand in for Ray's import surface (no Ray here)"
    )
    args = parser.parse_args()
    if args.ray_stub:
        sys.path.insert(0, str(REPO / "benchmarks"))
        import ray_import_stub  # noqa: F401

    import torch

    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
    )
    if not torch.cuda.is_available():
        print("verl_actor_gpu: no CUDA device here; verl's FSDP engine needs one", file=sys.stderr)
        return 2
    shape = QWEN05_SHAPE if args.model == "qwen0.5b" else TINY_SHAPE
    scale = 1.0 if args.model == "qwen0.5b" else 0.05
    summary: dict[str, Any] = {"device": torch.cuda.get_device_name(), "model": args.model}
    checks: dict[str, bool] = {}

    def phase(name: str, started: float) -> None:
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**30
        summary[f"{name}_seconds"] = round(seconds, 3)
        summary[f"{name}_peak_gib"] = round(peak, 2)
        print(f"{name:<24} {seconds:8.2f} s   peak GPU memory {peak:6.2f} GiB", flush=True)
        torch.cuda.reset_peak_memory_stats()

    t = time.perf_counter()
    model_dir = args.work_dir / "model"
    make_model(model_dir, shape)
    config = compose(model_dir)
    phase("model + config", t)

    from verl.workers.engine_workers import ActorRolloutRefWorker

    actor_cfg = config.actor_rollout_ref
    summary["token_budget"] = int(actor_cfg.actor.ppo_max_token_len_per_gpu)
    summary["use_remove_padding"] = bool(actor_cfg.model.use_remove_padding)
    t = time.perf_counter()
    worker = ActorRolloutRefWorker(actor_cfg, role="actor")
    worker.init_model()
    phase("init_model (FSDP)", t)
    checks["init_model ran"] = True

    from asyncrl.trainer.backends.verl.batch import build_trajectory_batch

    batch_rows = int(config.data.train_batch_size) * int(actor_cfg.rollout.n)
    group = int(actor_cfg.rollout.n)
    temperature = float(actor_cfg.rollout.temperature)
    rows = agent_rows(batch_rows, group, int(shape["vocab_size"]), seed=1, scale=scale)
    summary["rows"] = len(rows)
    summary["tokens"] = sum(len(r.prompt_token_ids) + len(r.response_token_ids) for r in rows)
    logprob_info = {"calculate_entropy": True, "compute_loss": False, "temperature": temperature}

    def log_probs(step: int) -> list[Any]:
        fields = build_trajectory_batch(rows, step=step).fields()
        output = worker.compute_log_prob(with_info(fields, dict(logprob_info)))
        return [lp.float() for lp in response_part(output["log_probs"], fields)]

    t = time.perf_counter()
    before = log_probs(0)
    phase("compute_log_prob (first)", t)
    t = time.perf_counter()
    before = log_probs(0)
    phase("compute_log_prob", t)
    checks["compute_log_prob ran"] = len(before) == len(rows)

    t = time.perf_counter()
    alone = hf_logprobs(model_dir, rows[:4], "cuda")
    gap = max(float((a - b).abs().max()) for a, b in zip(alone, before[:4], strict=True))
    summary["packed_vs_alone_max_gap"] = gap
    checks[f"packed log-probs match rows alone (gap {gap:.3g} < {LOGPROB_TOLERANCE})"] = (
        gap < LOGPROB_TOLERANCE
    )
    phase("HF forward, rows alone", t)

    generator = torch.Generator().manual_seed(2)
    update_metrics = []
    current = before
    for update in range(args.updates):
        fields = build_trajectory_batch(rows, step=update).fields()
        # The behaviour policy's log-probs drift from the actor's (as vLLM's do after an async step): the
        # token-level rollout correction weights (verl's truncated IS, threshold from the run) are exercised.
        behaviour = [lp + 0.05 * torch.randn(lp.shape, generator=generator) for lp in current]
        weights = [
            torch.exp(c - b).clamp(max=float(config.algorithm.rollout_correction.rollout_is_threshold))
            for c, b in zip(current, behaviour, strict=True)
        ]
        rewards = torch.tensor([r.reward for r in rows]).view(-1, group)
        advantage = (
            (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
        ).flatten()
        fields["old_log_probs"] = torch.nested.as_nested_tensor(current, layout=torch.jagged)
        fields["advantages"] = torch.nested.as_nested_tensor(
            [torch.full_like(c, float(a)) for c, a in zip(current, advantage, strict=True)],
            layout=torch.jagged,
        )
        fields["rollout_is_weights"] = torch.nested.as_nested_tensor(weights, layout=torch.jagged)
        info = {
            "calculate_entropy": False,
            "distillation_use_topk": False,
            "distillation_only": False,
            "global_batch_size": batch_rows,
            "mini_batch_size": batch_rows,
            "epochs": int(actor_cfg.actor.ppo_epochs),
            "seed": int(actor_cfg.actor.data_loader_seed),
            "dataloader_kwargs": {"shuffle": bool(actor_cfg.actor.shuffle)},
            "temperature": temperature,
        }
        t = time.perf_counter()
        output = worker.update_actor(with_info(fields, info))
        phase(f"update_actor #{update + 1}", t)
        metrics = {k: v for k, v in output["metrics"].items()}
        flat = {
            k: (float(sum(v) / len(v)) if isinstance(v, list) and v and isinstance(v[0], (int, float)) else v)
            for k, v in metrics.items()
        }
        printable = {k: v for k, v in flat.items() if isinstance(v, float)}
        print(
            "  verl metrics:",
            json.dumps({k: float(format(v, ".4g")) for k, v in sorted(printable.items())}),
            flush=True,
        )
        update_metrics.append(printable)
        loss, grad_norm = printable.get("loss"), printable.get("grad_norm")
        checks[f"update {update + 1}: finite loss and grad norm ({loss}, {grad_norm})"] = (
            loss is not None and grad_norm is not None and math.isfinite(loss) and math.isfinite(grad_norm)
        )
        t = time.perf_counter()
        after = log_probs(update + 1)
        phase(f"compute_log_prob #{update + 2}", t)
        moved = max(float((a - b).abs().max()) for a, b in zip(after, current, strict=True))
        checks[f"update {update + 1}: the policy moved (max log-prob change {moved:.3g})"] = moved > 1e-4
        current = after
    summary["updates"] = update_metrics
    summary["checks"] = checks
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2, default=str))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
