"""The run's rollout sampling settings: shared vocabulary of the run spec (asyncrl.api) and the gateway.

A leaf module (no imports from the rest of the package): the spec validates `spec.trainer.verlOverrides`
with `rollout_sampling_of` and names the policy; the gateway (asyncrl.gateway.sampling) applies them to the
agents' train-mode model calls. Why the gateway owns these settings is told there.

A run trains at any temperature but only with top_p 1 and top_k off. vLLM reports each sampled token's
log-prob after its top-k/top-p filter (processed_logprobs, as verl starts it), while both trainer backends
recompute the old log-probs from the whole distribution (verl's `post_process_logits` has the filters
commented out; the Reference backend recomputes at temperature 1), so any filter biases every importance
weight. Validation-mode calls are not trained on: the gateway leaves their sampling alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

SAMPLING_KEYS = ("temperature", "top_p", "top_k")
VERL_ROLLOUT_PREFIX = "actor_rollout_ref.rollout."  # where a run sets them: spec.trainer.verlOverrides


class SamplingParamsPolicy(StrEnum):
    """What the gateway does with the sampling settings of agents' train-mode model calls."""

    ENFORCE = "Enforce"
    REJECT = "Reject"
    ALLOW = "Allow"

    @classmethod
    def from_flag(cls, value: str) -> SamplingParamsPolicy:
        """`enforce`, `reject`, `allow` (the CLI's spelling) or the manifest's `Enforce` (any case)."""
        for policy in cls:
            if value.lower() == policy.value.lower():
                return policy
        raise ValueError(f"sampling-params policy {value!r} is not one of enforce, reject, allow")


@dataclass(frozen=True)
class RolloutSampling:
    """The run's rollout sampling settings (verl's `actor_rollout_ref.rollout.*`; top_k -1: off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    def as_body(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def rollout_sampling_of(overrides: Mapping[str, Any]) -> RolloutSampling:
    """The run's settings from flat verl overrides (verl's defaults where unset); ValueError names the key."""
    values: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        name = VERL_ROLLOUT_PREFIX + key
        spellings = [spelling for spelling in (name, "+" + name) if spelling in overrides]
        if not spellings:
            continue
        if len(spellings) > 1:
            raise ValueError(f"{name} is set twice, as {name} and +{name}: keep one")
        value = overrides[spellings[0]]
        wanted = int if key == "top_k" else float
        if isinstance(value, bool) or not isinstance(value, int | float) or (wanted is int and value % 1):
            raise ValueError(f"{name} must be {'an integer' if wanted is int else 'a number'}, not {value!r}")
        values[key] = wanted(value)
    sampling = RolloutSampling(**values)
    if not sampling.temperature > 0:  # NaN too
        raise ValueError(
            f"{VERL_ROLLOUT_PREFIX}temperature must be above 0 for training (greedy decoding gives every "
            f"token probability 1), not {sampling.temperature}"
        )
    if sampling.top_p != 1:
        raise ValueError(_filter_refusal("top_p", sampling.top_p, "nucleus", "set it to 1.0"))
    if sampling.top_k > 0:
        raise ValueError(_filter_refusal("top_k", sampling.top_k, "top-k", "set it to -1 (or 0)"))
    if sampling.top_k < -1:
        raise ValueError(f"{VERL_ROLLOUT_PREFIX}top_k must be -1 or 0 (off), not {sampling.top_k}")
    return sampling


def _filter_refusal(key: str, value: float, kind: str, fix: str) -> str:
    return (
        f"{VERL_ROLLOUT_PREFIX}{key} is {value!r}, but training needs {key} off: vLLM reports each sampled "
        f"token's log-prob after the {kind} filter, the trainer recomputes it without any filter, so every "
        f"importance weight would be biased; remove {VERL_ROLLOUT_PREFIX}{key} from "
        f"spec.trainer.verlOverrides or {fix} (an agent's validation-mode calls, which are not trained on, "
        f"may still send their own {key})"
    )
