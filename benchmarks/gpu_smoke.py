"""GPU smoke run of the verl backend: a few async steps end to end on one GPU, with a model made here.

What it runs
    A small Llama (random weights, the reference backend's byte tokenizer with its ChatML template) is written
    to --work-dir/model as a Hugging Face model directory: nothing is downloaded, so it runs on a machine
    without network. Then `asyncrl local run` with the toy agent of the quickstart and `trainer.backend: Verl`
    on 1 GPU: the real gateway, the real trainer (verl's colocate_async machinery: FSDP actor and a vLLM
    replica on the same GPU, sleep/wake around each update) and local agents. --steps updates (default 3),
    asynchronously (windowSize = 2 x trainBatchSize).

What it prints
    The local run's status lines while it runs; then per step the six window metrics (the seed's), the step
    and update times and the reward, and the values the strict checks read (gpu_smoke_check.py: rows
    trained, model version, finite loss and grad norm, rollout correction, vLLM's log-probs vs the actor's,
    no dropped calls, one trainer start, each step once). Exit code 0 only when every check passes; on
    failure, the tails of the trainer's and gateway's logs.

Cleanup
    The run starts in its own session; when it ends or times out, every process group in its process tree
    (the gateway, the trainer, Ray's and vLLM's processes, the agents) is sent SIGTERM, then SIGKILL.

Needs
    An NVIDIA GPU, and this repository's checkout with `pip install -e '.[trainer,gpu]'` (torch 2.11.0, vllm
    0.24.0, verl 0.9.1: see trainer_image/constraints.txt), or the trainer image with the checkout mounted.
    Run it as `benchmarks/gpu_smoke.sh`, which checks those first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_smoke_check.py, beside this file
from gpu_smoke_check import read_metrics, verdict

from asyncrl import metric_names as names

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "examples" / "quickstart-local.yaml"

# The seed's window metrics under their W&B names (asyncrl.trainer.window.StepSummary.metrics).
SIX = tuple(
    f"training/async/{name}"
    for name in (
        "n_prev_carry_over_rollouts",
        "n_completed_rollouts",
        "n_new_carry_over_rollouts",
        "new_carry_over_age_max_steps",
        "proxy_inflight_at_pause",
        "proxy_drain_seconds",
        "proxy_aborted_calls",
    )
)
TIMES = (names.STEP_SECONDS, names.UPDATE + "seconds", names.SCORE_MEAN)


def make_model(directory: Path) -> None:
    """A small Llama with random weights and the byte tokenizer, saved as vLLM and verl load a HF model."""
    from asyncrl.testing.tiny_model import save_tiny_model
    from asyncrl.trainer.backends.reference.config import ModelConfig

    config = ModelConfig(
        hidden_size=256, num_layers=4, num_heads=4, intermediate_size=512, max_model_len=4096
    )
    save_tiny_model(directory, config=config)


def manifest(model_dir: Path, steps: int) -> dict[str, Any]:
    run: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    run["metadata"]["name"] = "gpu-smoke"
    spec = run["spec"]
    spec["model"] = {"name": "smoke-policy", "path": str(model_dir)}
    spec["totalSteps"] = steps
    spec["logging"] = {"wandb": {"mode": "Disabled"}}
    spec["trainer"] = {
        "backend": "Verl",
        "gpus": 1,
        "checkpoint": {"everySteps": steps},
        "verlOverrides": {
            "actor_rollout_ref.actor.optim.lr": 1e-5,
            # Small model, small memory: leave most of the GPU to the actor, start vLLM fast.
            "actor_rollout_ref.rollout.gpu_memory_utilization": 0.3,
            "actor_rollout_ref.rollout.enforce_eager": True,
        },
    }
    spec["data"] = {**spec["data"], "maxPromptLength": 1024, "maxResponseLength": 1024}
    return run


def run_local(run_file: Path, work_dir: Path, metrics_file: Path, timeout: float) -> int:
    argv = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "local",
        "run",
        str(run_file),
        f"--work-dir={work_dir}",
        f"--metrics-file={metrics_file}",
    ]
    print("+", " ".join(argv), flush=True)
    process = subprocess.Popen(argv, cwd=REPO, start_new_session=True)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"gpu_smoke: the run did not finish within {timeout:.0f}s", flush=True)
        return 124
    finally:
        stop_process_tree(process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def process_groups(root: int) -> list[int]:
    """The process groups of `root` and all its descendants (read from /proc), root's first."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        groups[int(entry.name)] = int(fields[2])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    ordered = [groups[root]] if root in groups else []
    return ordered + sorted({groups[pid] for pid in tree if pid in groups} - set(ordered))


def stop_process_tree(root: int, grace_seconds: float = 15.0) -> None:
    """SIGTERM every process group of the run's tree, then SIGKILL what is left after the grace period."""
    groups = [group for group in process_groups(root) if group != os.getpgrp()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
                alive.append(group)
        if not alive or sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and any(_group_alive(group) for group in alive):
            time.sleep(0.5)
        groups = [group for group in alive if _group_alive(group)]


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def tail(path: Path, lines: int = 40) -> str:
    if not path.is_file():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def report(metrics_file: Path) -> int:
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    labels = [name.rsplit("/", 1)[-1] for name in SIX] + list(TIMES)  # verl's names read whole
    print("\nstep  " + "  ".join(labels))
    for row in rows:
        values = [row.get(name) for name in SIX + TIMES]
        cells = [
            "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
            for value in values
        ]
        print(
            f"{row.get('step', '?'):>4}  "
            + "  ".join(f"{cell:>{len(name)}}" for cell, name in zip(cells, labels, strict=True))
        )
    return len(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/asyncrl-gpu-smoke"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout-seconds", type=float, default=480.0)
    args = parser.parse_args()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    model_dir = work / "model"
    if not (model_dir / "config.json").is_file():
        make_model(model_dir)
    print(f"model: {model_dir} ({time.monotonic() - started:.1f}s)", flush=True)
    run_file = work / "gpu-smoke.yaml"
    run_file.write_text(yaml.safe_dump(manifest(model_dir, args.steps), sort_keys=False))
    metrics_file = work / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    run_dir = work / "run"
    code = run_local(run_file, run_dir, metrics_file, args.timeout_seconds)
    steps = report(metrics_file) if metrics_file.is_file() else 0
    rows = read_metrics(metrics_file) if metrics_file.is_file() else []
    trainer_log = run_dir / "trainer.log"
    result = verdict(
        rows,
        steps=args.steps,
        trainer_log=trainer_log.read_text(errors="replace") if trainer_log.is_file() else "",
    )
    print("\n" + result.table)
    problems = ([f"the run exited with code {code}"] if code != 0 else []) + result.problems
    print(
        f"\ngpu_smoke: {steps} of {args.steps} steps in {time.monotonic() - started:.0f}s (exit code {code})"
    )
    if problems:
        for problem in problems:
            print(f"FAIL {problem}")
        for name in ("trainer.log", "gateway.log"):
            print(f"\n--- last lines of {run_dir / name} ---\n{tail(run_dir / name)}")
        print(f"gpu_smoke: FAILED; logs in {run_dir} (trainer.log, gateway.log, agents/)")
        return 1
    print("gpu_smoke: PASSED")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
