"""The gateway's configuration: one model, filled from CLI flags (or the trainer's rendered config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

KEY_ENV_VAR = "ASYNCRL_GATEWAY_KEY"


class GatewayConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    upstreams: tuple[str, ...] = Field(description="Base URLs of OpenAI-compatible inference servers.")
    model: str = Field(description="The model name forwarded upstream, whatever name the agent sends.")
    key: SecretStr = Field(description="The gateway key; agent tokens are derived from it.")
    retry_after_seconds: int = Field(default=5, ge=1, description="Retry-After sent with 429 while paused.")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="Larger requests get 413.")
    upstream_timeout_seconds: float = Field(default=600.0, gt=0, description="Per model call; then 504.")
    upstream_connect_attempts: int = Field(default=4, ge=1, description="Connect retries before 502.")
    max_events_per_rollout: int = Field(default=512, ge=1, description="Older model calls are dropped.")
    max_completion_feed_entries: int = Field(default=100_000, ge=100, description="Retained feed length.")
    capture_token_ids: bool = Field(
        default=True, description="Ask the upstream for token ids and log-probs on train-mode calls."
    )

    @field_validator("upstreams")
    @classmethod
    def _at_least_one_upstream(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("give at least one --upstream URL (an OpenAI-compatible server)")
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} must start with http:// or https://")
        return tuple(url.rstrip("/") for url in value)
