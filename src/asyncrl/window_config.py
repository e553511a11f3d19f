"""The async window's settings: shared vocabulary of the run spec (asyncrl.api) and the trainer's window.

A leaf module (no imports from the rest of the package) so that the API types can state and validate the
window rules without importing the trainer: `spec.window_config()` returns this, `trainer.window` runs it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StalenessPolicy(StrEnum):
    """What happens to groups older than `max_carry_over_age_steps` when a step begins."""

    CANCEL = "Cancel"  # leave the window; the caller cancels their rollouts and draws fresh prompts instead
    KEEP = "Keep"  # stay in the window and are only reported as stale


class WindowConfig(BaseModel):
    """The window's part of the run spec (camelCase names in the CRD, snake_case here).

    No field has a default here: the run spec's `AsyncSpec` holds them (one default per field), and
    `AsyncSpec.window_config()` builds this from it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    train_batch_size: int = Field(ge=1, description="Complete prompt groups consumed per update.")
    samples_per_prompt: int = Field(ge=1, description="Sibling rollouts per prompt group (verl's rollout.n).")
    async_enabled: bool = Field(description="Keep a larger window and carry groups over.")
    async_window_size: int | None = Field(
        ge=1, description="Prompt groups kept active in async mode; > train_batch_size."
    )
    max_carry_over_age_steps: int | None = Field(
        ge=1, description="Oldest carry-over age allowed in a step; None keeps every group."
    )
    staleness_policy: StalenessPolicy = Field(
        description="What happens to groups older than the maximum age."
    )
    refill_during_collection: bool = Field(
        description="Async: draw a new group whenever one completes, so window_size groups stay unfinished "
        "while a step collects (finished ones wait for the update beside them); off, the window is refilled "
        "only when a step begins.",
    )

    @model_validator(mode="after")
    def _async_window_exceeds_train_batch(self) -> Self:
        if self.async_enabled and (
            self.async_window_size is None or self.async_window_size <= self.train_batch_size
        ):
            given = "unset" if self.async_window_size is None else str(self.async_window_size)
            raise ValueError(
                f"windowSize ({given}) must be greater than trainBatchSize "
                f"({self.train_batch_size}) when async is enabled; "
                f"try windowSize: {2 * self.train_batch_size} (2 x trainBatchSize)"
            )
        return self

    @property
    def window_size(self) -> int:
        """Unfinished groups the window keeps: windowSize in async mode, else trainBatchSize."""
        if self.async_enabled and self.async_window_size is not None:
            return self.async_window_size
        return self.train_batch_size

    @property
    def refills(self) -> bool:
        """Whether the window is refilled during collection (async mode with refill_during_collection)."""
        return self.async_enabled and self.refill_during_collection

    @property
    def max_groups(self) -> int:
        """Groups the window holds at most. Refilled during collection it keeps window_size unfinished ones
        and fewer than trainBatchSize finished ones beside them (with that many the update runs instead)."""
        if self.refills:
            return self.window_size + self.train_batch_size - 1
        return self.window_size
