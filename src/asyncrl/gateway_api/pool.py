"""Wire models of the agent pool's routes (`/api/pool/*`), shared by the gateway and the pool runner.

A pool worker is one long-lived agent pod (`spec.agents.mode: Pool`); it runs one rollout at a time, so the
gateway can tell from a worker's next claim that its previous rollout is over (see `routes/pool.py`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from asyncrl.gateway_api.models import ID_PATTERN, RolloutView
from asyncrl.rollouts import RolloutState

WORKER_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"  # a pod name


class PoolClaim(BaseModel):
    """`POST /api/pool/claim`: the worker takes (and launches) the next queued rollout, waiting for one."""

    model_config = ConfigDict(extra="forbid")

    worker: str = Field(pattern=WORKER_PATTERN, description="The pool pod's name.")
    wait_seconds: float = Field(default=30.0, ge=0, le=300)


class PoolAssignment(BaseModel):
    """A rollout launched for a worker, with the token its agent gets as AGL_KEY; None: nothing queued."""

    rollout: RolloutView | None = None
    launch_id: str | None = None
    agent_key: str | None = None
    interrupted: list[str] = Field(
        default_factory=list,
        description="Rollouts this worker had started before it restarted: failed now, never rerun.",
    )


class PoolOutcome(BaseModel):
    """`POST /api/pool/rollouts/{id}/transition`: the worker reports what its agent did."""

    model_config = ConfigDict(extra="forbid")

    worker: str = Field(pattern=WORKER_PATTERN)
    state: RolloutState
    message: str | None = Field(default=None, max_length=4096)
    attempt_id: str | None = Field(default=None, pattern=ID_PATTERN)


class PoolRelease(BaseModel):
    """`POST /api/pool/release`: the operator names the pool pods that exist; rollouts held by any other
    worker (a deleted or replaced pod) are failed, never rerun."""

    model_config = ConfigDict(extra="forbid")

    live_workers: list[str] = Field(max_length=10_000)
    min_age_seconds: float = Field(
        default=60.0,
        ge=0,
        description="Spare rollouts launched more recently: a pod created after the operator listed the pods "
        "is not in live_workers yet.",
    )


class PoolReleased(BaseModel):
    failed: list[str]
