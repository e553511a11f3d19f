"""The names of the trainer's per-step metrics, in one place for everyone who writes or reads them.

The trainer logs one flat dict per step (JSON lines, W&B, TensorBoard, Prometheus); `asyncrl plot`,
`asyncrl runs summary|plot`, the chart's dashboard and docs/metrics.md read it back by name. Where verl logs
the same quantity, the name is verl's (`critic/score/mean`, `actor/pg_loss`, `response_length/mean`,
`timing_s/step`), so a verl user reads a run as in verl; what verl has no metric for keeps an asyncrl name
under one of `OWN_NAMESPACES`. verl's own metric dicts (the rollout-correction helper's, and with the Verl
backend everything its update returns) are logged verbatim, under their names.

Metrics files written before the rename carry asyncrl's old names for verl's quantities: `READ_ALIASES`
lets the readers find them there, so an old run's history still plots. The trainer writes only new names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# -- verl's names, for quantities the trainer measures itself ---------------------------------------------

SCORE_MEAN = "critic/score/mean"  # mean sequence reward over the update's rows (0.0 when it has none)
SCORE_MAX = "critic/score/max"
SCORE_MIN = "critic/score/min"
SCORE = "critic/score"  # the prefix of the three above
ACTOR_PG_LOSS = "actor/pg_loss"
ACTOR_GRAD_NORM = "actor/grad_norm"
ACTOR_PG_CLIPFRAC = "actor/pg_clipfrac"
ACTOR_PPO_KL = "actor/ppo_kl"
TOTAL_NUM_TOKENS = "perf/total_num_tokens"  # prompt + response tokens of the update's rows
STEP_SECONDS = "timing_s/step"
RESPONSE_LENGTH = "response_length"  # /mean, /max, /min, /clip_ratio
PROMPT_LENGTH = "prompt_length"  # /mean, /max, /min
RESPONSE_LENGTH_CLIP_RATIO = f"{RESPONSE_LENGTH}/clip_ratio"

# Every verl name the trainer produces from its own measurements (docs/metrics.md lists each).
VERL_NAMES = frozenset(
    {
        SCORE_MEAN,
        SCORE_MAX,
        SCORE_MIN,
        ACTOR_PG_LOSS,
        ACTOR_GRAD_NORM,
        ACTOR_PG_CLIPFRAC,
        ACTOR_PPO_KL,
        TOTAL_NUM_TOKENS,
        STEP_SECONDS,
        *(f"{RESPONSE_LENGTH}/{stat}" for stat in ("mean", "max", "min", "clip_ratio")),
        *(f"{PROMPT_LENGTH}/{stat}" for stat in ("mean", "max", "min")),
    }
)

# verl's own metric dicts that both backends log verbatim: the rollout-correction helper's diagnostics. (The
# Verl backend also logs everything verl's actor update returns, `actor/*`, `perf/*`, ..., as verl names it.)
VERL_NAMESPACES = ("rollout_corr/",)

# -- asyncrl's own names, for what verl has no metric for -------------------------------------------------

ASYNC = "training/async/"  # the window: the six carry-over metrics, stale groups, failed rollouts
ADAPTER = "training/adapter/"  # events to rows
PREFETCH = "training/prefetch/"  # rows prepared before the pause
UPDATE = "training/update/"  # the update's own counts: step, version, rows, tokens, seconds
TIMING = "timing/"  # the phases of an async step, and the rollouts' queue and run times
OWN_NAMESPACES = (ASYNC, ADAPTER, PREFETCH, UPDATE, TIMING)

CARRY_OVER_ROLLOUTS = ASYNC + "n_new_carry_over_rollouts"
CARRY_OVER_AGE_MAX = ASYNC + "new_carry_over_age_max_steps"
COMPLETED_ROLLOUTS = ASYNC + "n_completed_rollouts"
FAILED_ROLLOUTS_CONSUMED = ASYNC + "n_failed_rollouts_consumed"
DRAIN_SECONDS = ASYNC + "proxy_drain_seconds"
UPDATE_PHASE_SECONDS = TIMING + "update_phase_seconds"
PAUSE_TO_UPDATE_SECONDS = TIMING + "pause_to_update_seconds"
ROLLOUT_QUEUE_WAIT_SECONDS = TIMING + "rollout_queue_wait_seconds"  # _min, _mean, _max
ROLLOUT_RUN_SECONDS = TIMING + "rollout_run_seconds"  # _min, _mean, _max

# -- files written before the rename ----------------------------------------------------------------------

# Old name -> the name that quantity is logged under now. Readers only: the trainer never writes an old name.
# training/update/reward_mean and the importance weights were logged twice (verl's rollout_corr/* carried
# the same weights); they now live under the verl name alone.
READ_ALIASES: Mapping[str, str] = {
    "training/reward_mean": SCORE_MEAN,
    "training/update/reward_mean": SCORE_MEAN,
    "training/update/loss": ACTOR_PG_LOSS,
    "training/update/grad_norm": ACTOR_GRAD_NORM,
    "training/update/clip_fraction": ACTOR_PG_CLIPFRAC,
    "training/update/ppo_kl": ACTOR_PPO_KL,
    "training/update/total_tokens": TOTAL_NUM_TOKENS,
    "training/update/importance_weight_mean": "rollout_corr/rollout_is_mean",
    "training/update/importance_weight_max": "rollout_corr/rollout_is_max",
    "training/update/importance_weight_min": "rollout_corr/rollout_is_min",
    "timing/step_seconds": STEP_SECONDS,
}


def is_verl_or_own(metric: str) -> bool:
    """Whether `metric` is one of verl's names (listed, or in verl's own dicts) or in asyncrl's namespaces."""
    return metric in VERL_NAMES or metric.startswith(VERL_NAMESPACES) or metric.startswith(OWN_NAMESPACES)


def with_current_names(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` with each old name's value also under its current name (a current name present wins)."""
    current = dict(record)
    for old, new in READ_ALIASES.items():
        if old in record and new not in current:
            current[new] = record[old]
    return current


def prometheus_name(metric: str) -> str:
    """The trainer's gauge for `metric`: `asyncrl_` + the name with every character other than letters,
    digits and `_` replaced by `_` (`critic/score/mean` → `asyncrl_critic_score_mean`)."""
    return "asyncrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", metric)
