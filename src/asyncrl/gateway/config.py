"""The gateway's configuration: one model; what the run decides is its `run` part (`run_settings.py`), the
rest (admission limits, connections, upstream timeouts) the gateway's own flags with their defaults here."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from asyncrl.gateway.budgets import AgentBudget
from asyncrl.gateway.connections import ConnectionLimits
from asyncrl.gateway.run_settings import GatewayRunSettings
from asyncrl.gateway_api.upstreams import check_upstream_urls

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_JSON_DEPTH = 64
# Python's JSON parser and encoders recurse per level and fail near 1000; stay well below.
MAX_JSON_DEPTH_CEILING = 256
DEFAULT_MAX_EVENT_BYTES = 1024 * 1024


class GatewayConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    upstreams: tuple[str, ...] = Field(
        default=(),
        description="Base URLs of OpenAI-compatible inference servers; empty until registered at run time "
        "with PUT /api/upstreams (model calls get 503 meanwhile).",
    )
    run: GatewayRunSettings = Field(description="What the run decides: the model, pauses, capture, sampling.")
    key: SecretStr = Field(description="The gateway key; agent tokens are derived from it.")
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        description="Larger request bodies get 413, counted while they arrive (chunked bodies too).",
    )
    max_json_depth: int = Field(
        default=DEFAULT_MAX_JSON_DEPTH,
        ge=2,
        le=MAX_JSON_DEPTH_CEILING,
        description="Request JSON nested deeper gets 422, on every route and model call.",
    )
    max_event_bytes: int = Field(
        default=DEFAULT_MAX_EVENT_BYTES,
        ge=1024,
        description="Event data one rollout may store in all (its JSON size); more gets 413.",
    )
    upstream_timeout_seconds: float = Field(default=600.0, gt=0, description="Per model call; then 504.")
    upstream_connect_attempts: int = Field(default=4, ge=1, description="Connect retries before 502.")
    max_events_per_rollout: int = Field(default=512, ge=1, description="Older model calls are dropped.")
    max_completion_feed_entries: int = Field(default=100_000, ge=100, description="Retained feed length.")
    capture_token_ids: bool = Field(
        default=True, description="Ask the upstream for token ids and log-probs on train-mode calls."
    )

    body_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="A request body not all received this long after its headers gets 408.",
    )
    agent_budget: AgentBudget = Field(
        default_factory=AgentBudget, description="What one agent token may use of the gateway."
    )
    connections: ConnectionLimits = Field(
        default_factory=ConnectionLimits, description="Connection timeouts and the connection cap."
    )

    @model_validator(mode="after")
    def _burst_holds_a_body(self) -> GatewayConfig:
        if self.agent_budget.burst_bytes < self.max_body_bytes:
            raise PydanticCustomError(
                "agent_burst",
                "--agent-burst-bytes ({burst}) must be at least --max-body-bytes ({body}), or an agent's "
                "largest body is always refused",
                {"burst": self.agent_budget.burst_bytes, "body": self.max_body_bytes},
            )
        return self

    @field_validator("upstreams")
    @classmethod
    def _valid_upstreams(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_upstream_urls(value)
