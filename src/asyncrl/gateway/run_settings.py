"""The gateway's settings that its run decides, derived from the run here and nowhere else.

The gateway reads the run's manifest (`run.yaml`: the run's ConfigMap on a cluster, the work folder in local
mode) as the trainer does, and takes these from it: a setting travels as the run's typed value, never as a
flag string. A gateway run by hand (`asyncrl gateway --model M`, no `--config`) gets what a run that leaves
`spec.gateway` empty gets: `standalone_defaults` reads them from the API's `GatewaySpec`, the one place they
are written. No field below has a default of its own. Pure: the server reads the file.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.api.types.spec import GatewaySpec
from asyncrl.capturing import CaptureMode
from asyncrl.pause_modes import PauseMode
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy

MIN_RETRY_AFTER_SECONDS = 0.001  # Retry-After and retry-after-ms are sent with millisecond precision


class GatewayRunSettings(BaseModel):
    """What a run decides about its gateway (`spec.gateway`, the model, the rollout sampling)."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(
        min_length=1, description="The model name forwarded upstream, whatever name the agent sends."
    )
    retry_after_seconds: float = Field(
        ge=MIN_RETRY_AFTER_SECONDS,
        le=3600,
        description="Retry-After (fractions allowed; also sent as retry-after-ms) with 429 while paused and "
        "503 while no upstream, in Reject mode and when a held call is refused.",
    )
    pause_mode: PauseMode = Field(description="What a model call that arrives while paused gets.")
    hold_timeout_seconds: float = Field(
        gt=0, allow_inf_nan=False, description="Hold mode: a call held this long gets its refusal."
    )
    max_held_calls: int = Field(ge=1, description="Hold mode: calls held at once; one more is refused.")
    capture: CaptureMode = Field(description="What the store keeps of each model call.")
    max_capture_bytes_per_rollout: int = Field(
        ge=4096, description="Captured model calls one rollout may hold; its calls past it get 413."
    )
    max_capture_bytes: int = Field(
        ge=4096,
        description="Captured model calls the whole store may hold; calls past it get 507 until the trainer "
        "consumes rollouts.",
    )
    sampling_params: SamplingParamsPolicy = Field(
        description="Enforce, Reject or Allow the agents' own sampling parameters on train-mode calls."
    )
    rollout_sampling: RolloutSampling = Field(description="The run's rollout temperature, top_p and top_k.")


def run_settings(spec: AsyncTrainingRunSpec) -> GatewayRunSettings:
    """The gateway's settings for this run."""
    return _settings(spec.gateway, model=spec.model.name, rollout_sampling=spec.trainer.rollout_sampling())


def standalone_defaults(*, model: str) -> GatewayRunSettings:
    """A gateway run by hand: the settings of a run whose `spec.gateway` is empty (and verl's sampling)."""
    return _settings(GatewaySpec(), model=model, rollout_sampling=RolloutSampling())


def _settings(gateway: GatewaySpec, *, model: str, rollout_sampling: RolloutSampling) -> GatewayRunSettings:
    return GatewayRunSettings(
        model=model,
        retry_after_seconds=gateway.retry_after_seconds,
        pause_mode=gateway.pause_mode,
        hold_timeout_seconds=gateway.hold_timeout_seconds,
        max_held_calls=gateway.max_held_calls,
        capture=gateway.capture,
        max_capture_bytes_per_rollout=gateway.max_capture_bytes_per_rollout,
        max_capture_bytes=gateway.max_capture_bytes,
        sampling_params=gateway.sampling_params,
        rollout_sampling=rollout_sampling,
    )
