"""The gateway's configuration: one model, filled from CLI flags (or the trainer's rendered config)."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from asyncrl.capturing import DEFAULT_MAX_CAPTURE_BYTES, DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT, CaptureMode
from asyncrl.gateway.budgets import AgentBudget
from asyncrl.gateway.connections import ConnectionLimits
from asyncrl.pausing import PauseMode
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy

KEY_ENV_VAR = "ASYNCRL_GATEWAY_KEY"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_JSON_DEPTH = 64
# Python's JSON parser and encoders recurse per level and fail near 1000; stay well below.
MAX_JSON_DEPTH_CEILING = 256
DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
# Compact capture keeps about 4 bytes per prompt token and 12 per generated token; 64 MiB is a 50-turn
# agent resending a 16k-token context each turn with room to spare, 1 GiB a window of 1,024 rollouts of 20
# calls of 2,000 + 500 tokens about 3.5 times over (docs/tuning-the-window.md sizes the gateway's memory).
DEFAULT_HOLD_TIMEOUT_SECONDS = 900.0
DEFAULT_MAX_HELD_CALLS = 10_000
MIN_RETRY_AFTER_SECONDS = 0.001  # Retry-After and retry-after-ms are sent with millisecond precision


def check_upstream_urls(urls: Iterable[str]) -> tuple[str, ...]:
    """The upstream server roots (`server_root`: no trailing slash or `/v1`, duplicates dropped); a clear
    error otherwise.

    Shared by the configuration (flags) and `PUT /api/upstreams`, so both accept exactly the same URLs.
    """
    checked: dict[str, None] = {}
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise PydanticCustomError(
                "upstream_url", "upstream {url} must start with http:// or https://", {"url": repr(url)}
            )
        if not urlsplit(url).netloc or any(char.isspace() for char in url):
            raise PydanticCustomError(
                "upstream_url", "upstream {url} is not a URL with a host", {"url": repr(url)}
            )
        checked[server_root(url)] = None
    return tuple(checked)


OPENAI_BASE_SUFFIX = "/v1"
ENDPOINT_SUFFIXES = ("/chat/completions", "/completions", "/models")


def server_root(url: str) -> str:
    """The URL the gateway appends `/v1/<endpoint>` to, from a server root or an OpenAI base URL.

    vLLM's docs and every OpenAI client write the base URL with `/v1` (`http://host:8000/v1`); the gateway
    forwards to `{root}/v1/chat/completions`, so both spellings name the same server. An endpoint's own URL
    is refused: it would be forwarded to `.../chat/completions/v1/chat/completions` and get vLLM's bare 404.
    """
    root = url.rstrip("/")
    for suffix in ENDPOINT_SUFFIXES:
        if root.endswith(suffix):
            raise PydanticCustomError(
                "upstream_url",
                "upstream {url} is an endpoint's URL; give the server's base URL, e.g. {base}",
                {"url": repr(url), "base": repr(root[: -len(suffix)])},
            )
    if root.endswith(OPENAI_BASE_SUFFIX):
        root = root[: -len(OPENAI_BASE_SUFFIX)]
    return root


class GatewayConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    upstreams: tuple[str, ...] = Field(
        default=(),
        description="Base URLs of OpenAI-compatible inference servers; empty until registered at run time "
        "with PUT /api/upstreams (model calls get 503 meanwhile).",
    )
    model: str = Field(description="The model name forwarded upstream, whatever name the agent sends.")
    key: SecretStr = Field(description="The gateway key; agent tokens are derived from it.")
    retry_after_seconds: float = Field(
        default=5,
        ge=MIN_RETRY_AFTER_SECONDS,
        le=3600,
        description="Retry-After (fractions allowed; also sent as retry-after-ms) with 429 while paused and "
        "503 while no upstream, in Reject mode and when a held call is refused.",
    )
    pause_mode: PauseMode = Field(
        default=PauseMode.HOLD,
        description="Hold: calls that arrive while paused (or before any upstream) wait and are forwarded at "
        "the resume. Reject: they get 429 + Retry-After (503 without an upstream) at once.",
    )
    hold_timeout_seconds: float = Field(
        default=DEFAULT_HOLD_TIMEOUT_SECONDS,
        gt=0,
        allow_inf_nan=False,
        description="Hold mode: a call held this long gets the 429 (or 503) it would have had.",
    )
    max_held_calls: int = Field(
        default=DEFAULT_MAX_HELD_CALLS,
        ge=1,
        description="Hold mode: calls held at once; one more gets the 429 (or 503) it would have had.",
    )
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
    capture: CaptureMode = Field(
        default=CaptureMode.COMPACT,
        description="Compact: keep token ids and log-probs as arrays, drop the request and response JSON. "
        "Full: keep both JSON bodies too (debugging; several times the memory).",
    )
    max_capture_bytes_per_rollout: int = Field(
        default=DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT,
        ge=4096,
        description="Captured model calls one rollout may hold; its calls past it get 413.",
    )
    max_capture_bytes: int = Field(
        default=DEFAULT_MAX_CAPTURE_BYTES,
        ge=4096,
        description="Captured model calls the whole store may hold; calls past it get 507 until the trainer "
        "consumes rollouts.",
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

    sampling_params: SamplingParamsPolicy = Field(
        default=SamplingParamsPolicy.ENFORCE,
        description="Enforce, Reject or Allow the agents' own temperature/top_p/top_k on train-mode calls.",
    )
    rollout_sampling: RolloutSampling = Field(
        default_factory=RolloutSampling, description="The run's rollout sampling settings."
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
