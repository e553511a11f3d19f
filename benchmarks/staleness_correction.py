"""Reward per step at a fixed data age, for each rollout-correction setting (issue 27 item 2).

`time_to_reward.py` measures the whole local loop in wall-clock, where the age of the data an update trains
on varies and CPU contention moves every figure. This benchmark holds the age fixed and leaves out the
gateway and the agent processes, so only what the update learns is measured:

- The quickstart task in-process: its 4 prompts x 4 samples per update, each sample the toy agent's two
  model calls (turn 1, the tool's fixed "tool: ok. finish" turn, turn 2; the tool's latency is irrelevant
  here and not simulated), rendered by the reference server's own `parse_chat` and sampled by its own
  `generate`, rewarded by the toy agent's own `reward_of`. The calls become training rows through the
  trainer's own adapter (`adapt_rollout`, trajectory level), so an update gets exactly what the trainer
  gets from the gateway: merged turns, the tool turn as mask-0 context, the behaviour log-prob of every
  sampled token.
- At age k, update s trains on a batch sampled by the policy as it was k updates earlier (version
  max(0, s - k): a queue of the frozen copies the backend publishes), with the log-probs that sampling
  recorded. Age 0 is sync (on-policy).
- The update is `ReferenceBackend.update_blocking` (verl's GRPO in decoupled mode, `grpo_update`), with the
  quickstart's learning rate and each setting's `rollout_is` / `rollout_rs`.
- After every update, the current policy's mean reward on a fresh sample (same prompts, its own seed
  stream) is the reward per step. A seed sets the initial weights and both sampling streams.

It prints, per setting and age, the mean eval reward of the last updates (mean and range over seeds), the
first update reaching each threshold (median over seeds), each as a ratio to the same setting at age 0, and
the importance weights seen; then the issue's target (within 10 % of sync at ages 1 and 2) per setting. With
matplotlib it draws the curves to `--png`. It never asserts; tests/test_staleness_correction.py runs a tiny
version.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]  # where examples/ is
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _common import table, verdict  # noqa: E402
from examples.toy_agent.agent import reward_of  # noqa: E402
from staleness_correction_stats import (  # noqa: E402
    RunCurve,
    ratio_to_sync,
    summarise_all,
    table_headers,
    table_rows,
)

from asyncrl.trainer.adapter import AdapterConfig, adapt_rollout  # noqa: E402
from asyncrl.trainer.backends.reference import ReferenceBackend, ServedPolicy  # noqa: E402
from asyncrl.trainer.backends.reference.config import (  # noqa: E402
    ModelConfig,
    ReferenceBackendConfig,
    UpdateConfig,
)
from asyncrl.trainer.backends.reference.openai_api import parse_chat  # noqa: E402
from asyncrl.trainer.backends.reference.sampling import generate  # noqa: E402
from asyncrl.trainer.backends.reference.tokenizer import stop_token_ids  # noqa: E402
from asyncrl.trainer.rows import TrainingRow  # noqa: E402

QUICKSTART = ROOT / "examples" / "quickstart-local.yaml"
LEARNING_RATE_KEY = "actor_rollout_ref.actor.optim.lr"
MAX_TOKENS = 12  # the toy agent's max_tokens per call
TOOL_TURN = "tool: ok. finish"  # the toy agent's second user turn


@dataclass(frozen=True)
class Setting:
    """One rollout-correction setting, in the reference backend's (verl's) names."""

    name: str
    rollout_is: str | None
    rollout_is_threshold: float = 2.0
    rollout_rs: str | None = None
    rollout_rs_threshold: str | None = None
    about: str = ""

    def update_config(self, learning_rate: float) -> UpdateConfig:
        return UpdateConfig.model_validate(
            {
                "learning_rate": learning_rate,
                "rollout_is": self.rollout_is,
                "rollout_is_threshold": self.rollout_is_threshold,
                "rollout_rs": self.rollout_rs,
                "rollout_rs_threshold": self.rollout_rs_threshold,
            }
        )


SETTINGS = {
    s.name: s
    for s in (
        Setting("disabled", None, about="spec.rolloutCorrection Disabled; verl 0.9's shipped YAML default"),
        Setting("token", "token", about="spec.rolloutCorrection Token, threshold 2 (asyncrl's default)"),
        Setting("sequence", "sequence", about="Sequence, threshold 2 (verl's RolloutCorrectionConfig())"),
        Setting(
            "token-mask",
            "token",
            rollout_rs="token_k1",
            rollout_rs_threshold="0.5_2.0",
            about="Token IS 2 + tokens whose ratio is outside [0.5, 2] masked (verl rollout_rs token_k1)",
        ),
        Setting(
            "seq-is-rs",
            "sequence",
            rollout_rs="seq_sum_k1",
            rollout_rs_threshold="0.5_2.0",
            about="verl's decoupled_seq_is_rs preset: Sequence IS 2 + sequences outside [0.5, 2] masked",
        ),
    )
}


@dataclass(frozen=True)
class Task:
    """The quickstart's prompts, group size and learning rate."""

    rows: tuple[dict[str, str], ...]
    samples_per_prompt: int
    learning_rate: float


def quickstart_task(path: Path = QUICKSTART) -> Task:
    spec = yaml.safe_load(path.read_text())["spec"]
    overrides = spec["trainer"].get("verlOverrides") or {}
    return Task(
        rows=tuple({"prompt": str(r["prompt"]), "target": str(r["target"])} for r in spec["data"]["inline"]),
        samples_per_prompt=int(spec["rollout"]["samplesPerPrompt"]),
        learning_rate=float(overrides.get(LEARNING_RATE_KEY, UpdateConfig().learning_rate)),
    )


class ToyAgent:
    """The toy agent's two model calls, against a served policy in-process instead of over HTTP."""

    def __init__(self, backend: ReferenceBackend) -> None:
        self.tokenizer: PreTrainedTokenizerFast = backend.tokenizer
        self.server_config = backend.config.server
        self.max_model_len = backend.config.model.max_model_len
        self.stops = stop_token_ids(self.tokenizer)

    def call(
        self, policy: ServedPolicy, messages: list[dict[str, str]], generator: torch.Generator
    ) -> tuple[str, dict[str, Any]]:
        """One chat call: its text and the record the gateway would capture."""
        body = {"model": self.server_config.served_model_name, "messages": messages}
        _request, generation = parse_chat(
            {**body, "max_tokens": MAX_TOKENS, "temperature": 1.0},
            tokenizer=self.tokenizer,
            config=self.server_config,
            max_model_len=self.max_model_len,
        )
        sample = generate(
            policy.model,
            self.tokenizer,
            prompt_token_ids=generation.prompt_token_ids,
            params=generation.params,
            stop_token_ids=self.stops,
            generator=generator,
        )
        record = {
            "status": 200,
            "endpoint": "chat/completions",
            "model_version": policy.version,
            "started_at": time.time(),
            "prompt_token_ids": generation.prompt_token_ids,
            "response_token_ids": list(sample.token_ids),
            "response_logprobs": list(sample.logprobs),
        }
        return sample.text, record

    def rollout(
        self, policy: ServedPolicy, row: dict[str, str], generator: torch.Generator
    ) -> tuple[float, list[dict[str, Any]]]:
        """The agent's reward and its captured calls."""
        messages = [{"role": "user", "content": f"{row['prompt']} using {row['target']}"}]
        first, first_call = self.call(policy, messages, generator)
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": TOOL_TURN}]
        second, second_call = self.call(policy, messages, generator)
        return reward_of(first + second, row["target"]), [first_call, second_call]


def training_rows(
    agent: ToyAgent, policy: ServedPolicy, task: Task, *, step: int, generator: torch.Generator
) -> list[TrainingRow]:
    """One batch as the trainer would receive it: every prompt's group, through the trainer's adapter."""
    rows: list[TrainingRow] = []
    for prompt_index, row in enumerate(task.rows):
        group_id = f"s{step}-p{prompt_index}"
        for sample in range(task.samples_per_prompt):
            reward, calls = agent.rollout(policy, row, generator)
            document = {
                "rollout": {
                    "rollout_id": f"{group_id}-r{sample}",
                    "group_id": group_id,
                    "step": step,
                    "input": row,
                    "mode": "train",
                    "state": "succeeded",
                    "attempt_id": None,
                    "timeout_seconds": None,
                    "created_at": 0.0,
                    "started_at": 0.0,
                    "finished_at": 0.0,
                    "reward": reward,
                    "message": None,
                    "n_model_calls": len(calls),
                },
                "model_calls": calls,
            }
            rows += adapt_rollout(document, group_id=group_id, config=AdapterConfig()).rows
    return rows


def eval_reward(
    agent: ToyAgent, policy: ServedPolicy, task: Task, *, samples_per_prompt: int, generator: torch.Generator
) -> float:
    """The policy's mean reward on a fresh sample of every prompt."""
    rewards = [
        agent.rollout(policy, row, generator)[0] for row in task.rows for _ in range(samples_per_prompt)
    ]
    return statistics.fmean(rewards)


def run(
    setting: Setting, *, age: int, seed: int, steps: int, task: Task, eval_samples_per_prompt: int
) -> RunCurve:
    """One (setting, age, seed) run of `steps` updates."""
    started = time.perf_counter()
    backend = ReferenceBackend(
        ReferenceBackendConfig(model=ModelConfig(seed=seed), update=setting.update_config(task.learning_rate))
    )
    agent = ToyAgent(backend)
    sampling = torch.Generator().manual_seed(2 * seed)
    evaluating = torch.Generator().manual_seed(2 * seed + 1)
    # The frozen copies the backend published, newest last; the oldest is version max(0, step - age).
    published: deque[ServedPolicy] = deque([backend.server.policy], maxlen=age + 1)
    rewards = [
        eval_reward(
            agent, published[-1], task, samples_per_prompt=eval_samples_per_prompt, generator=evaluating
        )
    ]
    versions: list[int] = []
    weight_means: list[float | None] = []
    weight_maxes: list[float | None] = []
    masked: list[float | None] = []
    for step in range(steps):
        behaviour = published[0]
        rows = training_rows(agent, behaviour, task, step=step, generator=sampling)
        versions.append(min(row.model_version for row in rows if row.model_version is not None))
        metrics = backend.update_blocking(rows, step=step)
        weight_means.append(metrics.importance_weight_mean)
        weight_maxes.append(metrics.importance_weight_max)
        masked.append(metrics.extra.get("rollout_corr/rollout_rs_masked_fraction"))
        published.append(backend.server.policy)
        rewards.append(
            eval_reward(
                agent, published[-1], task, samples_per_prompt=eval_samples_per_prompt, generator=evaluating
            )
        )
    return RunCurve(
        setting=setting.name,
        age=age,
        seed=seed,
        eval_rewards=tuple(rewards),
        behaviour_versions=tuple(versions),
        weight_means=tuple(weight_means),
        weight_maxes=tuple(weight_maxes),
        masked_fractions=tuple(masked),
        seconds=time.perf_counter() - started,
    )


def load_records(path: Path) -> list[RunCurve]:
    """Runs already measured (one JSON line each), so an interrupted benchmark resumes where it stopped."""
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        if line.strip():
            fields = json.loads(line)
            runs.append(RunCurve(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}))
    return runs


def append_record(path: Path, curve: RunCurve) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(dataclasses.asdict(curve)) + "\n")


def report(runs: Sequence[RunCurve], *, last: int, thresholds: Sequence[float], ages: Sequence[int]) -> str:
    """The table, then the issue's target per setting (last-steps reward within 10 % of sync)."""
    rows = summarise_all(runs, last=last, thresholds=thresholds)
    lines = [table(table_headers(last=last, thresholds=thresholds), table_rows(rows, thresholds=thresholds))]
    for setting in dict.fromkeys(r.setting for r in rows):
        for age in (a for a in ages if 1 <= a <= 2):
            value = ratio_to_sync(rows, setting=setting, age=age)
            if value is not None:
                lines.append(
                    verdict(f"{setting} age {age} within 10 % of sync", value >= 0.9, f"x{value:.2f}")
                )
    return "\n".join(lines)


def draw(runs: Sequence[RunCurve], path: Path) -> str:
    """Eval reward per update, one panel per setting, one colour per age, the mean over seeds."""
    try:
        import matplotlib
    except ImportError:
        return "no curves drawn: matplotlib is not installed (pip install -e '.[plot]')"
    matplotlib.use("Agg")
    from matplotlib import pyplot

    settings = list(dict.fromkeys(r.setting for r in runs))
    ages = sorted({r.age for r in runs})
    figure, axes = pyplot.subplots(1, len(settings), figsize=(4 * len(settings), 3.5), squeeze=False)
    for axis, setting in zip(axes[0], settings, strict=True):
        for age in ages:
            curves = [r.eval_rewards for r in runs if r.setting == setting and r.age == age]
            if curves:
                mean = [statistics.fmean(values) for values in zip(*curves, strict=True)]
                axis.plot(range(len(mean)), mean, label=f"age {age}")
        axis.set_title(setting)
        axis.set_xlabel("updates")
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("eval reward (mean over seeds)")
    axes[0][0].legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return f"curves: {path}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--ages", nargs="+", type=int, default=[0, 1, 2, 4], help="data age in updates")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16, help="updates per run")
    parser.add_argument(
        "--eval-samples", type=int, default=4, help="eval samples per prompt after each update"
    )
    parser.add_argument(
        "--last", type=int, default=4, help="the table's reward is the mean of the last N updates"
    )
    parser.add_argument("--thresholds", nargs="+", type=float, default=[0.3, 0.6, 0.9])
    parser.add_argument(
        "--records",
        type=Path,
        default=Path(".asyncrl/staleness-correction/records.jsonl"),
        help="one JSON line per finished run; runs already there are not run again",
    )
    parser.add_argument("--png", type=Path, default=None, help="default: records.png beside the records")
    parser.add_argument(
        "--report-only", action="store_true", help="print the table of the recorded runs asked for; run none"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[RunCurve]:
    args = parse_args(argv)
    torch.set_num_threads(1)  # as the reference backend does; also keeps runs reproducible
    task = quickstart_task()
    for name in args.settings:
        print(f"{name}: {SETTINGS[name].about}")
    done = {(r.setting, r.age, r.seed, r.steps): r for r in load_records(args.records)}
    wanted = [(s, a, seed) for seed in args.seeds for s in args.settings for a in args.ages]
    runs: list[RunCurve] = []
    started = time.perf_counter()
    for index, (name, age, seed) in enumerate(wanted, start=1):
        curve = done.get((name, age, seed, args.steps))
        if curve is None and args.report_only:
            continue
        if curve is None:
            curve = run(
                SETTINGS[name],
                age=age,
                seed=seed,
                steps=args.steps,
                task=task,
                eval_samples_per_prompt=args.eval_samples,
            )
            append_record(args.records, curve)
        runs.append(curve)
        elapsed = time.perf_counter() - started
        print(
            f"[{index}/{len(wanted)}] {name} age {age} seed {seed}: "
            f"last reward {curve.eval_rewards[-1]:.2f}, "
            f"{curve.seconds:.1f} s (elapsed {elapsed:.0f} s)",
            flush=True,
        )
    print()
    print(report(runs, last=args.last, thresholds=args.thresholds, ages=args.ages))
    print(draw(runs, args.png or args.records.with_suffix(".png")))
    return runs


if __name__ == "__main__":
    main()
