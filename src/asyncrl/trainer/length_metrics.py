"""Prompt and response lengths of an update's rows, under verl's metric names (`response_length/*`).

verl users read `response_length/mean` and `response_length/clip_ratio` to see a policy's answers grow,
shrink or hit the length limit. The names and meanings are verl's: lengths in tokens per training row, and
the clip ratio as the share of rows whose response was cut at the limit (`spec.data.maxResponseLength`).
A row's response holds every token after its prompt, so at `Trajectory` level it includes the tool output
and later turns that sit in it with mask 0. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl import metric_names as names
from asyncrl.trainer.metrics import spread
from asyncrl.trainer.rows import TrainingRow


def length_metrics(rows: Sequence[TrainingRow]) -> dict[str, float]:
    """`response_length/{mean,max,min,clip_ratio}` and `prompt_length/{mean,max,min}`; empty for no rows."""
    if not rows:
        return {}
    responses = [float(len(row.response_token_ids)) for row in rows]
    prompts = [float(len(row.prompt_token_ids)) for row in rows]
    return {
        **spread(names.RESPONSE_LENGTH, responses, separator="/"),
        names.RESPONSE_LENGTH_CLIP_RATIO: sum(row.truncated for row in rows) / len(rows),
        **spread(names.PROMPT_LENGTH, prompts, separator="/"),
    }
