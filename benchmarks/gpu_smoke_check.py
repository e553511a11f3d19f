"""The GPU smoke's verdict: did every step really train, on the weights vLLM serves?

Exit code 0 and N metric lines prove little: a step can train no row, the trainer can restart and repeat a
step, the loss can be NaN (the metrics file drops non-finite values), and vLLM can keep serving its dummy
start-up weights while the actor trains. This reads the trainer's metrics file (one JSON object per step,
`asyncrl.trainer.metrics.JsonLinesSink`) and its log, and fails unless, for every step:

- it appears once, steps are 0..N-1, and `model_version` is step + 1 (it advanced once per step);
- it trained rows (`training/update/rows` > 0), with a finite loss and grad norm (`actor/pg_loss`,
  `actor/grad_norm`);
- rollout correction ran (verl's `rollout_corr/rollout_is_mean` present);
- vLLM's log-probs match the actor's (`training/rollout_probs_diff_valid` 1, mean probability gap at most
  MAX_PROBS_DIFF_MEAN and Pearson correlation at least MIN_PEARSON: with dummy weights they disagree);
- no model call was dropped for missing token ids or log-probs (the capture path works);

and the trainer started once (its log holds one preflight report). Pure functions, unit-tested on CPU with
recorded metric files (tests/trainer/backends/test_gpu_smoke_check.py); `gpu_smoke.py` calls `verdict`.
The two log-prob thresholds are first guesses, not yet measured on a GPU run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl import metric_names as names

MAX_PROBS_DIFF_MEAN = 0.05
MIN_PEARSON = 0.9
TRAINER_START_MARKER = "asyncrl.trainer.main preflight:"  # logged once per trainer start
IMPORTANCE_WEIGHT_MEAN = "rollout_corr/rollout_is_mean"  # verl's rollout-correction helper names it
DROPPED = (
    "training/adapter/dropped_calls_without_tokens",
    "training/adapter/dropped_calls_without_logprobs",
)
SHOWN = (
    ("rows", "training/update/rows"),
    ("version", "training/update/model_version"),
    ("loss", names.ACTOR_PG_LOSS),
    ("grad_norm", names.ACTOR_GRAD_NORM),
    ("is_mean", IMPORTANCE_WEIGHT_MEAN),
    ("probs_diff", "training/rollout_probs_diff_mean"),
    ("pearson", "training/rollout_actor_probs_pearson_corr"),
)


@dataclass(frozen=True)
class Verdict:
    table: str  # one line per step, the values the checks read
    problems: list[str]  # empty: the smoke passed

    @property
    def passed(self) -> bool:
        return not self.problems


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trainer_starts(log_text: str) -> int:
    return sum(TRAINER_START_MARKER in line for line in log_text.splitlines())


def step_problems(row: dict[str, Any]) -> list[str]:
    step = row.get("step")
    where = f"step {step}"
    problems = []
    rows = row.get("training/update/rows")
    if not isinstance(rows, int | float) or rows <= 0:
        problems.append(f"{where}: trained no rows (training/update/rows = {rows})")
    if isinstance(step, int) and row.get("training/update/model_version") != step + 1:
        problems.append(
            f"{where}: model_version is {row.get('training/update/model_version')}, expected {step + 1}"
        )
    for name in (names.ACTOR_PG_LOSS, names.ACTOR_GRAD_NORM):
        value = row.get(name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"{where}: {name} is missing or not finite")
    if IMPORTANCE_WEIGHT_MEAN not in row:
        problems.append(f"{where}: no rollout-correction metrics ({IMPORTANCE_WEIGHT_MEAN})")
    if row.get("training/rollout_probs_diff_valid") != 1:
        problems.append(f"{where}: no rollout-vs-actor comparison (training/rollout_probs_diff_valid)")
    else:
        gap = row.get("training/rollout_probs_diff_mean", math.inf)
        pearson = row.get("training/rollout_actor_probs_pearson_corr", -math.inf)
        if not gap <= MAX_PROBS_DIFF_MEAN or not pearson >= MIN_PEARSON:
            problems.append(
                f"{where}: vLLM's log-probs disagree with the actor's (mean probability gap {gap}, Pearson "
                f"{pearson}; want <= {MAX_PROBS_DIFF_MEAN} and >= {MIN_PEARSON}): is vLLM serving the "
                "trained weights?"
            )
    for name in DROPPED:
        if row.get(name, 0) != 0:
            problems.append(f"{where}: {name} = {row[name]} (the gateway's capture lost calls)")
    return problems


def verdict(rows: list[dict[str, Any]], *, steps: int, trainer_log: str) -> Verdict:
    problems: list[str] = []
    seen = Counter(row.get("step") for row in rows)
    repeated = sorted(step for step, count in seen.items() if count > 1)
    if repeated:
        problems.append(f"steps logged more than once: {repeated} (did the trainer restart?)")
    if sorted(seen) != list(range(steps)):
        problems.append(f"steps logged: {sorted(seen, key=str)}, expected 0..{steps - 1}")
    for row in rows:
        problems += step_problems(row)
    starts = trainer_starts(trainer_log)
    if starts != 1:
        problems.append(f"the trainer started {starts} times, expected once")
    return Verdict(table=table(rows), problems=problems)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["step  " + "  ".join(f"{label:>10}" for label, _ in SHOWN)]
    for row in rows:
        cells = []
        for _, name in SHOWN:
            value = row.get(name)
            cells.append("-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value))
        lines.append(f"{row.get('step', '?')!s:>4}  " + "  ".join(f"{cell:>10}" for cell in cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--metrics-file", type=Path, required=True)
    parser.add_argument("--trainer-log", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    result = verdict(
        read_metrics(args.metrics_file), steps=args.steps, trainer_log=args.trainer_log.read_text()
    )
    print(result.table)
    for problem in result.problems:
        print(f"FAIL {problem}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
