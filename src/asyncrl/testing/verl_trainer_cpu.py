"""verl's own trainer, through our `VerlBackend`, end to end on a CPU-only machine, for tests/verl_cpu/.

Runs with the python of `scripts/provision-verl-cpu.sh` (verl, Ray, TransferQueue and the vLLM CPU build in
one interpreter) and `PYTHONPATH=src`:

    python -m asyncrl.testing.verl_trainer_cpu CONFIG.yaml REPORT.json --steps N
        [--checkpoint-dir DIR (--save-at-version V | --resume)]

CONFIG.yaml is verl's trainer config as `compose_verl_config` makes it, with the CPU changes the test applies
(tests/verl_cpu/cpu_config.py). This driver starts Ray on the CPUs, as our backend starts it but with the
"GPU" resource counted (`num_gpus`: verl's pools count GPUs, `single_controller/ray/base.py:240`), then runs
the real `VerlBackend.start()` (verl's worker groups, FSDP over gloo, the vLLM replicas verl launches, the
initial weight sync), and N times the step loop's sequence: rows sampled from the served vLLM (its token
ids and log-probs), `sleep()`, `update(rows)`, `wake()`. It saves a checkpoint at a version, or loads one
(`--resume`) before the steps, as the step loop does. After each version it records the served model's
log-probability of a fixed text (`probe_log_prob`). The report (JSON, rewritten after each phase so that a
failure or a kill keeps what ran) holds the timings, verl's metrics per step and the error, if any. stdout
carries one JSON line per phase; Ray's and vLLM's output goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

PLATFORM_ENV = {
    # asyncrl.testing.verl_cpu_platform, loaded by every process that imports verl
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": "asyncrl.testing.verl_cpu_platform",
    # verl's documented engine override (verl/workers/engine/base.py:405): FSDP is registered for cuda/npu
    "VERL_ENGINE_DEVICE": "cuda",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
RAY_CPUS = 12  # logical: TransferQueue's controller and storage unit, 3 per "GPU" bundle, vLLM's actors
RAY_START_ATTEMPTS = 3
SAMPLE_TOKENS = 12
PROMPTS = ["Name two colours.", "Count to three."]
PROBE = "The policy after each update scores this text."


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Report:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"phases": [], "steps": []}

    def phase(self, name: str, seconds: float, **extra: Any) -> None:
        entry = {"phase": name, "seconds": round(seconds, 2), **extra}
        self.data["phases"].append(entry)
        self.save()
        print(json.dumps(entry, default=repr), flush=True)

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2, default=repr))


async def sample_rows(url: str, model: str, *, version: int, step: int, samples: int) -> list[Any]:
    """Rows as the gateway's capture makes them: prompt ids, response ids and vLLM's log-probs."""
    from asyncrl.trainer.rows import TrainingRow

    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=600.0) as client:
        for prompt_index, prompt in enumerate(PROMPTS):
            for sample in range(samples):
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": SAMPLE_TOKENS,
                    "temperature": 1.0,
                    "logprobs": True,
                    "return_token_ids": True,
                    "seed": 1000 * step + 10 * prompt_index + sample,
                }
                answer = await client.post("/v1/chat/completions", json=body)
                answer.raise_for_status()
                reply = answer.json()
                (choice,) = reply["choices"]
                tokens = tuple(choice["token_ids"])
                logprobs = tuple(float(item["logprob"]) for item in choice["logprobs"]["content"])
                # A reward that differs between the samples of a prompt (GRPO's advantage is zero when
                # a group's rewards are equal): the share of even token ids.
                reward = sum(1 for token in tokens if token % 2 == 0) / max(len(tokens), 1)
                rows.append(
                    TrainingRow(
                        rollout_id=f"s{step}-p{prompt_index}-{sample}",
                        group_id=f"s{step}-p{prompt_index}",
                        prompt_token_ids=tuple(reply["prompt_token_ids"]),
                        response_token_ids=tokens,
                        response_mask=(1,) * len(tokens),
                        rollout_log_probs=logprobs,
                        reward=reward,
                        model_version=version,
                    )
                )
    return rows


async def probe_log_prob(url: str, model: str) -> float:
    """The served model's log-probability of PROBE (vLLM's prompt log-probs): it changes when, and only
    when, the weights vLLM serves change."""
    async with httpx.AsyncClient(base_url=url, timeout=600.0) as client:
        body = {"model": model, "prompt": PROBE, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
        answer = await client.post("/v1/completions", json=body)
        answer.raise_for_status()
        (choice,) = answer.json()["choices"]
    total = 0.0
    for position in choice["prompt_logprobs"][1:]:  # the first token has no log-prob
        (entry,) = position.values() if len(position) == 1 else list(position.values())[:1]
        total += float(entry["logprob"])
    return total


@dataclass(frozen=True)
class Plan:
    """What one driver run does: `steps` updates; a checkpoint saved once `save_at_version` is reached; or,
    with `resume`, the checkpoint loaded after start, before any step."""

    steps: int
    checkpoint_dir: Path | None = None
    save_at_version: int | None = None
    resume: bool = False

    def checkpoint_path(self, version: int) -> Path:
        assert self.checkpoint_dir is not None
        return self.checkpoint_dir / f"version-{version}"


async def run(config: Any, report: Report, plan: Plan) -> None:
    from asyncrl.trainer.backends.verl.backend import VerlBackend

    samples = int(config.actor_rollout_ref.rollout.n)
    backend = VerlBackend(config)
    started = time.monotonic()
    await backend.start()
    report.phase("start", time.monotonic() - started, serve_urls=list(backend.serve_urls))
    url, model = backend.serve_urls[0], backend.served_model
    report.data["probe_log_prob"] = {str(backend.model_version): await probe_log_prob(url, model)}
    try:
        if plan.resume:
            assert plan.checkpoint_dir is not None
            (path,) = sorted(plan.checkpoint_dir.glob("version-*"))
            loading = time.monotonic()
            version = await backend.load_checkpoint(path)
            report.data["probe_log_prob"][f"resumed-{version}"] = await probe_log_prob(url, model)
            report.phase("load_checkpoint", time.monotonic() - loading, version=backend.model_version)
        first = backend.model_version
        for step in range(first, first + plan.steps):
            await one_step(backend, report, step=step, samples=samples)
            if plan.save_at_version == backend.model_version:
                saving = time.monotonic()
                await backend.save_checkpoint(plan.checkpoint_path(backend.model_version), step=step + 1)
                report.phase("save_checkpoint", time.monotonic() - saving, version=backend.model_version)
    finally:
        stopping = time.monotonic()
        await backend.stop()
        report.phase("stop", time.monotonic() - stopping)


async def one_step(backend: Any, report: Report, *, step: int, samples: int) -> None:
    """The step loop's sequence around one update: rows at the served version, sleep, update, wake."""
    url, model = backend.serve_urls[0], backend.served_model
    version = backend.model_version
    began = time.monotonic()
    rows = await sample_rows(url, model, version=version, step=step, samples=samples)
    sampled = time.monotonic()
    await backend.sleep()
    slept = time.monotonic()
    metrics = await backend.update(rows, step=step)
    updated = time.monotonic()
    await backend.wake()
    woke = time.monotonic()
    report.data["steps"].append(
        {
            "step": step,
            "version_sampled": version,
            "rows": len(rows),
            "reward_mean": metrics.reward_mean,
            "loss": metrics.loss,
            "grad_norm": metrics.grad_norm,
            "sample_seconds": round(sampled - began, 2),
            "sleep_seconds": round(slept - sampled, 2),
            "update_seconds": round(updated - slept, 2),
            "wake_seconds": round(woke - updated, 2),
            "verl": metrics.extra,
        }
    )
    report.data["probe_log_prob"][str(backend.model_version)] = await probe_log_prob(url, model)
    # Every replica serves the new version (each is synced on its own: one per "GPU").
    report.data.setdefault("replica_probe_log_probs", {})[str(backend.model_version)] = [
        await probe_log_prob(replica, model) for replica in backend.serve_urls
    ]
    report.phase(f"step {step}", woke - began, version_after=backend.model_version)


def start_ray(*, gpus: int, runtime_env: dict[str, Any]) -> int:
    """`ray.init` on this machine's CPUs with `gpus` "GPU"s; the attempts it took. Ray gives its raylet 30 s
    to register (ray/_private/node.py:428, not configurable), which a loaded 2-core machine misses (seen at a
    load average of 35): that failure is retried, anything else is raised."""
    import ray

    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(num_cpus=RAY_CPUS, num_gpus=gpus, include_dashboard=False, runtime_env=runtime_env)
        except Exception as error:
            if "timed out during startup" not in str(error) or attempt == RAY_START_ATTEMPTS:
                raise
            _log(f"ray.init attempt {attempt} failed ({error}); retrying")
            ray.shutdown()
            continue
        return attempt
    raise AssertionError("unreachable")


def parse_plan(argv: list[str]) -> tuple[Path, Path, Plan]:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.testing.verl_trainer_cpu")
    parser.add_argument("config", type=Path)
    parser.add_argument("report", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--save-at-version", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    plan = Plan(
        steps=args.steps,
        checkpoint_dir=args.checkpoint_dir,
        save_at_version=args.save_at_version,
        resume=args.resume,
    )
    return args.config, args.report, plan


def main() -> None:
    config_path, report_path, plan = parse_plan(sys.argv[1:])
    for name, value in PLATFORM_ENV.items():
        os.environ.setdefault(name, value)
    # The protocol keeps stdout; Ray's forwarded worker logs and vLLM's output go to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = protocol
    report = Report(report_path)
    try:
        import ray
        from omegaconf import OmegaConf
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

        config = OmegaConf.load(config_path)
        runtime_env: dict[str, Any] = get_ppo_ray_runtime_env(config)  # type: ignore[no-untyped-call]
        env_vars = runtime_env.setdefault("env_vars", {})
        env_vars.update({name: os.environ[name] for name in PLATFORM_ENV})
        env_vars["TRANSFER_QUEUE_ENABLE"] = "1"
        env_vars["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
        gpus = int(config.trainer.n_gpus_per_node)
        started = time.monotonic()
        attempts = start_ray(gpus=gpus, runtime_env=runtime_env)
        report.phase("ray.init", time.monotonic() - started, gpus=gpus, attempts=attempts)
        asyncio.run(run(config, report, plan))
    except BaseException as error:
        report.data["error"] = f"{type(error).__name__}: {error}"
        report.data["traceback"] = traceback.format_exc()
        report.save()
        _log(traceback.format_exc())
        raise SystemExit(1) from error
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":
    main()
