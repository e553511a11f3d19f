"""How the gateway treats model calls around a weight update: one vocabulary for the spec, gateway, trainer.

A leaf module (no I/O, no imports from the rest of the package) so that the API types, the gateway and the
trainer can all name the same two choices. Values are CamelCase, as they appear in a manifest.
"""

from __future__ import annotations

from enum import StrEnum


class PauseMode(StrEnum):
    """What a model call that arrives while the gateway is paused (or has no upstream yet) gets."""

    HOLD = "Hold"  # parked in the gateway and forwarded at the resume: the agent sees one slow answer
    REJECT = "Reject"  # 429 + Retry-After + X-Agl-Paused (Agent Lightning's contract): the agent retries

    @classmethod
    def from_flag(cls, value: str) -> PauseMode:
        """`hold` / `reject` (the CLI's spelling) or the manifest's `Hold` / `Reject`."""
        for mode in cls:
            if value.lower() == mode.value.lower():
                return mode
        raise ValueError(f"pause mode {value!r} is not one of hold, reject")


class DrainPolicy(StrEnum):
    """What happens to model calls already in flight when the trainer pauses the gateway for an update."""

    ABORT = "Abort"  # cancelled upstream at once; re-issued after the resume (Hold) or answered 429 (Reject)
    WAIT = "Wait"  # the update waits until they finish (the drain)
