"""The run's rollout sampling settings, applied to the agents' train-mode model calls.

vLLM reports the log-prob of each sampled token under the sampling the request asked for (its temperature,
top_p, top_k); the trainer recomputes the old policy's log-probs at the run's rollout temperature, with no
top-p or top-k. Rollout importance weights are the ratio of the two, so an agent that samples at its own
settings (temperature 0.7 is a common default, and vLLM fills omitted values from the model's generation
config) biases every weight without any error. The gateway therefore owns these three settings on train-mode
calls (`spec.gateway.samplingParams`):

- `Enforce` (default): the run's values replace the agent's; what the agent asked for is kept with the
  captured call and calls that asked for something else are counted;
- `Reject`: a call that asks for other values gets 400 naming the setting;
- `Allow`: the agent's values go through untouched (the weights are then biased; for experiments).

Validation-mode calls are never changed. Pure: no I/O here, the proxy calls `apply_rollout_sampling`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl.rollout_sampling import SAMPLING_KEYS, RolloutSampling, SamplingParamsPolicy


class SamplingRefused(ValueError):
    """A train-mode call asked for sampling settings other than the run's (policy Reject)."""


@dataclass(frozen=True)
class SamplingOutcome:
    body: dict[str, Any]  # what is forwarded
    asked: dict[str, Any] | None  # the agent's own settings, when the run's replaced them; else None


def apply_rollout_sampling(
    body: dict[str, Any], *, policy: SamplingParamsPolicy, rollout: RolloutSampling, train: bool
) -> SamplingOutcome:
    """The request to forward under `policy`; SamplingRefused under Reject when the agent's values differ."""
    if not train or policy is SamplingParamsPolicy.ALLOW:
        return SamplingOutcome(body=body, asked=None)
    wanted = rollout.as_body()
    differing = {
        key: body[key] for key in SAMPLING_KEYS if key in body and not _same(key, body[key], wanted[key])
    }
    if policy is SamplingParamsPolicy.REJECT and differing:
        key, value = next(iter(differing.items()))
        raise SamplingRefused(
            f"{key}={value!r} differs from the run's rollout {key} ({wanted[key]!r}), and training needs the "
            f"log-probs of the run's sampling: omit {key} or send {wanted[key]!r} (the run's "
            "spec.gateway.samplingParams is Reject; Enforce replaces the agent's values instead)"
        )
    # Every key is set, even the ones the agent left out: vLLM would fill those from the model's generation
    # config, which need not match the run's settings.
    asked = {key: body[key] for key in SAMPLING_KEYS if key in body} if differing else None
    return SamplingOutcome(body={**body, **wanted}, asked=asked)


def sampling_args(policy: SamplingParamsPolicy, rollout: RolloutSampling) -> list[str]:
    """The `asyncrl gateway` flags that carry a run's policy and settings (the operator and local mode)."""
    return [
        f"--sampling-params={policy.value}",
        f"--rollout-temperature={rollout.temperature}",
        f"--rollout-top-p={rollout.top_p}",
        f"--rollout-top-k={rollout.top_k}",
    ]


def _same(key: str, value: Any, wanted: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False  # null or a string: not the run's value (vLLM would refuse or default it)
    if key == "top_k":
        return bool((value <= 0 and wanted <= 0) or value == wanted)  # 0 and -1 both mean "off" in vLLM
    return abs(float(value) - float(wanted)) <= 1e-9
