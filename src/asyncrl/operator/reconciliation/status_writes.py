"""When a changed status is written (pure): at once when it shows something new, later when only counts moved.

`kubectl get atr -w` prints a line for every write of the run. The agent Jobs' and rollouts' counts change
with every Job that starts or ends, and none of them is a default column, so writing each change printed
lines that repeat the one before (308 lines for 114 states on the quickstart). A change of anything else
(the phase, the step, the reward, the window's numbers, a condition, the message) is written at once; a
change of the counts alone waits until `COUNTS_MIN_INTERVAL_SECONDS` have passed since the last write, and
goes out with the next write in any case. A run that has ended writes its last counts at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncrl.api import Phase

COUNTS_MIN_INTERVAL_SECONDS = 10.0
COUNT_FIELDS = frozenset({"rollouts", "jobs"})  # status keys, as written (camelCase)


def write_due(
    written: Mapping[str, Any] | None, payload: Mapping[str, Any], *, seconds_since_write: float
) -> bool:
    """Whether `payload` is to be written now, `written` being what was last written (None: nothing yet)."""
    if written is None:
        return True
    if payload == written:
        return False
    changed = {key for key in written.keys() | payload.keys() if written.get(key) != payload.get(key)}
    phase = payload.get("phase")
    if not changed <= COUNT_FIELDS or (phase is not None and Phase(phase).is_terminal):
        return True
    return seconds_since_write >= COUNTS_MIN_INTERVAL_SECONDS
