"""Settings of the reference backend: the model's shape, the GRPO update, and the inference server.

The defaults make a model small enough that an update on 32 rows of about 100 tokens takes well under a
second on two CPU cores, which is what CI, local mode and the quickstart need; nothing is downloaded.
The update's names follow verl's config (`clip_ratio_low`, `rollout_is`, `rollout_is_threshold`, ...) so a
run's settings mean the same on both backends.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    """A small Llama-architecture causal LM built from this config with a fixed seed (no hub download)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden_size: int = Field(default=64, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(default=2, ge=1, description="Decoder layers.")
    num_heads: int = Field(default=4, ge=1, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(default=128, ge=8, description="Width of the MLP.")
    max_model_len: int = Field(default=1024, ge=16, description="Longest prompt + response, in tokens.")
    seed: int = Field(default=0, description="Seed of the initial weights: same seed, same model.")

    @model_validator(mode="after")
    def _heads_divide_hidden_size(self) -> Self:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}"
            )
        return self


class UpdateConfig(BaseModel):
    """One GRPO update: verl's GRPO advantages and PPO-clip loss, with rollout importance sampling."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: float = Field(default=1e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradients are clipped to this norm.")
    clip_ratio_low: float = Field(default=0.2, ge=0, description="PPO clip: ratio >= 1 - clip_ratio_low.")
    clip_ratio_high: float = Field(default=0.2, ge=0, description="PPO clip: ratio <= 1 + clip_ratio_high.")
    clip_ratio_c: float = Field(default=3.0, gt=1, description="Dual-clip bound for negative advantages.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        default="token-mean", description="How verl aggregates the per-token loss."
    )
    norm_adv_by_std_in_grpo: bool = Field(
        default=True, description="Divide advantages by the group's reward std (GRPO); False is Dr.GRPO."
    )
    rollout_is: Literal["token", "sequence"] | None = Field(
        default="token", description="Rollout importance-sampling level; None turns the correction off."
    )
    rollout_is_threshold: float = Field(default=2.0, gt=0, description="Importance weights are capped here.")
    rollout_rs: str | None = Field(
        default=None,
        description=(
            "verl's rejection sampling: tokens or sequences whose divergence from the behaviour policy is "
            "out of bounds are masked out of the loss (e.g. 'token_k1', 'seq_sum_k1'; comma separated); "
            "None masks nothing."
        ),
    )
    rollout_rs_threshold: str | float | None = Field(
        default=None,
        description="Bounds of rollout_rs as verl reads them (k1: 'lower_upper' ratios, e.g. '0.5_2.0').",
    )
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over the rows per update.")
    mini_batches: int = Field(default=1, ge=1, description="Optimizer steps per pass (rows split evenly).")

    @model_validator(mode="after")
    def _rejection_has_bounds(self) -> Self:
        if self.rollout_rs is not None and self.rollout_rs_threshold is None:
            raise ValueError(f"rollout_rs {self.rollout_rs!r} needs rollout_rs_threshold")
        return self


class ServerConfig(BaseModel):
    """The collocated OpenAI-compatible endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=0, ge=0, le=65535, description="Port; 0 picks a free one (see serve_urls).")
    url: str | None = Field(
        default=None,
        description="Where the gateway reaches this server, if not where it listens (e.g. through a proxy).",
    )
    served_model_name: str = Field(default="asyncrl-reference", description="The only model name accepted.")
    default_max_tokens: int = Field(default=64, ge=1, description="max_tokens when a request gives none.")
    worker_threads: int = Field(default=2, ge=1, description="Requests generated at the same time.")


class ReferenceBackendConfig(BaseModel):
    """Everything the reference backend is built from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    update: UpdateConfig = Field(default_factory=UpdateConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    torch_threads: int | None = Field(
        default=1,
        ge=1,
        description=(
            "torch's intra-op threads for the whole process; None keeps torch's default. On matrices this "
            "small, threads cost more than they save (measured: 5-8x slower updates with 2 threads on a "
            "busy 2-core machine), and requests already run in parallel on the server's worker threads."
        ),
    )
