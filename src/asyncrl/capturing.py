"""How much of each model call the gateway keeps: one vocabulary for the spec, the gateway and the docs.

A leaf module (no I/O, no imports from the rest of the package), like `asyncrl.pause_modes`, so the API
types and the gateway name the same choices. Values are CamelCase, as they appear in a manifest.
"""

from __future__ import annotations

from enum import StrEnum

# What the gateway's store may hold by default (spec.gateway.maxCaptureBytesPerRollout / maxCaptureBytes).
# Compact capture keeps about 4 bytes per prompt token and 12 per generated token; 64 MiB is a 50-turn
# agent resending a 16k-token context each turn with room to spare, 1 GiB a window of 1,024 rollouts of 20
# calls of 2,000 + 500 tokens about 3.5 times over (docs/tuning-the-window.md sizes the gateway's memory).
DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT = 64 * 1024 * 1024
DEFAULT_MAX_CAPTURE_BYTES = 1024 * 1024 * 1024


class CaptureMode(StrEnum):
    """What the gateway's store keeps of a captured model call besides its metadata."""

    # Token ids and log-probs as packed arrays: what training reads, about 12 bytes per generated token and
    # 4 per prompt token. The request and response JSON are dropped once the tokens are read from them.
    COMPACT = "Compact"
    # Also the forwarded request's and the upstream response's JSON bytes, shown in the events document
    # (`request`, `response`): for debugging an agent or a model server; several times the memory.
    FULL = "Full"

    @classmethod
    def from_flag(cls, value: str) -> CaptureMode:
        """`compact` / `full` (the CLI's spelling) or the manifest's `Compact` / `Full`."""
        for mode in cls:
            if value.lower() == mode.value.lower():
                return mode
        raise ValueError(f"capture mode {value!r} is not one of compact, full")
