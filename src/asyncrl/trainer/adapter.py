"""Turn one rollout's captured model calls into training rows: the single bridge from gateway to trainer.

Every training backend trains on `TrainingRow`s, and what goes into them decides what the optimizer learns:
which tokens carry loss, which log-probs importance sampling divides by, which reward a failed agent gets.
Those rules live here once, as plain Python without I/O, so both backends agree and property-based tests can
pin them. The input is the events document (`asyncrl.gateway_api.events.EventsDocument`, the type the gateway
writes it with); the output is rows plus counts of everything that was dropped, truncated or filled in, so
nothing is lost silently.

Rules, in the order they apply:

- The rollout must be terminal and in `train` mode. Its reward is the posted one if it succeeded; a failed,
  timed-out or cancelled rollout gets `failed_rollout_reward` (a reward it posted is ignored); a succeeded
  rollout that posted no (finite) reward gets `missing_reward`, which defaults to `failed_rollout_reward`.
- Calls count only with status 200, prompt and response token ids, and one finite log-prob per response
  token. When the rollout names its attempt, calls of other attempts (an earlier, abandoned agent run)
  are dropped too. Each dropped call is counted by reason. Calls are ordered by `started_at`.
- `transition` level: one row per call. `trajectory` level: a call whose prompt starts with exactly an open
  row's prompt + response extends that row; the tokens in between (tool output, the next user turn, chat
  template tokens) join the response with mask 0 and log-prob 0.0, then the call's response with mask 1. A
  call that extends no open row starts a new row (a trajectory break). A dropped call's tokens therefore
  reappear as mask-0 context in the next call's prompt: conditioning stays exact, they are just not trained.
- A row whose prompt exceeds `max_prompt_tokens` is dropped; a response beyond `max_response_tokens` is cut
  at the limit (`truncated=True`); a row left without a mask-1 token is dropped. All are counted.

Groups: a rollout without usable calls yields no rows, but its `AdapterResult` still carries its reward, so
`group_rewards` returns one reward per sibling and GRPO/RLOO statistics cover the whole group. Backends should
compute advantages per rollout from `group_rewards` and give every row of a rollout that rollout's advantage;
statistics computed over rows instead would miss row-less siblings and over-weight rollouts that produced
several rows (trajectory breaks, or every call at `transition` level).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from asyncrl import metric_names as names
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.api.types.spec import SampleLevel
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.rows import TrainingRow

logger = logging.getLogger(__name__)

SUCCESS_STATUS = 200


class AdapterConfig(BaseModel):
    """The adapter's part of the trainer configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample_level: SampleLevel = Field(
        default=SampleLevel.TRAJECTORY, description="One row per call, or per conversation."
    )
    max_prompt_tokens: int = Field(default=4096, ge=1, description="Longer prompts drop their row.")
    max_response_tokens: int = Field(default=4096, ge=1, description="Longer responses are cut here.")
    failed_rollout_reward: float = Field(
        default=0.0, allow_inf_nan=False, description="Reward of failed, timed-out and cancelled rollouts."
    )
    missing_reward: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Reward of succeeded rollouts that posted none; None means failed_rollout_reward.",
    )

    @classmethod
    def of_run(cls, spec: AsyncTrainingRunSpec) -> AdapterConfig:
        """What a run's spec asks of the adapter."""
        return cls(
            sample_level=spec.trainer.sample_level,
            failed_rollout_reward=spec.trainer.failed_rollout_reward,
            max_prompt_tokens=spec.data.max_prompt_length,
            max_response_tokens=spec.data.max_response_length,
        )

    @property
    def reward_when_missing(self) -> float:
        """The reward a succeeded rollout without a posted reward gets."""
        return self.failed_rollout_reward if self.missing_reward is None else self.missing_reward


# -- output: rows and counts --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AdapterCounts:
    """What the adapter did, summed over any number of rollouts with `+` or `AdapterCounts.total`.

    Every call ends in exactly one of: used, or one `dropped_calls_*`. Every candidate row (one per used call
    at `transition` level, one per conversation at `trajectory` level) ends in exactly one of: `rows`,
    `dropped_long_prompt`, `dropped_rows_without_trained_tokens`. `truncated_rows` counts emitted rows only.
    """

    rollouts: int = 0
    rollouts_failed: int = 0  # failed, timed out or cancelled: given failed_rollout_reward
    rollouts_missing_reward: int = 0  # succeeded without a (finite) posted reward: given missing_reward
    rollouts_without_rows: int = 0  # produced no rows; still in their group (see `group_rewards`)
    calls: int = 0
    dropped_calls_failed: int = 0  # status other than 200 (e.g. 429 while the gateway was paused)
    dropped_calls_without_tokens: int = 0  # prompt or response token ids missing
    dropped_calls_without_logprobs: int = 0  # log-probs missing, non-finite, or not one per response token
    dropped_calls_other_attempt: int = 0  # made by an attempt other than the rollout's final one
    rows: int = 0
    dropped_long_prompt: int = 0
    dropped_rows_without_trained_tokens: int = 0
    truncated_rows: int = 0
    trajectory_breaks: int = 0  # calls that extended no open row and started another row of their rollout
    trained_tokens: int = 0  # mask-1 tokens in emitted rows

    def __add__(self, other: AdapterCounts) -> AdapterCounts:
        return AdapterCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)}
        )

    @staticmethod
    def total(counts: Iterable[AdapterCounts]) -> AdapterCounts:
        """The sum of many counts (all zero for none)."""
        return sum(counts, AdapterCounts())

    def metrics(self) -> dict[str, float]:
        """The counts under `training/adapter/` names, for W&B and Prometheus."""
        return {names.ADAPTER + f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True, kw_only=True)
class AdapterResult:
    """One rollout's rows, the reward they carry, and the counts; `rows` may be empty."""

    rollout_id: str
    group_id: str
    state: RolloutState
    reward: float  # the reward on every row, fill/missing reward applied; also when there are no rows
    rows: tuple[TrainingRow, ...]
    counts: AdapterCounts


# -- rewards ------------------------------------------------------------------------------------------------


def rollout_reward(*, state: RolloutState, reward: float | None, config: AdapterConfig) -> float:
    """The reward a terminal rollout trains with: its own if it succeeded, else the configured fill."""
    if not state.is_terminal:
        raise ValueError(f"a rollout in state {state} has no final reward yet")
    if state is not RolloutState.SUCCEEDED:
        return config.failed_rollout_reward
    if reward is None or not math.isfinite(reward):
        return config.reward_when_missing
    return reward


def group_rewards(
    results: Iterable[AdapterResult], *, rollout_ids: Sequence[str] | None = None
) -> dict[str, float]:
    """One reward per rollout of a group, including siblings that produced no rows.

    With `rollout_ids` (the group's members, e.g. `Group.rollout_ids`) the results must cover exactly those
    rollouts, and the answer follows their order; a group is never trained on with a sibling missing.
    """
    rewards: dict[str, float] = {}
    group_ids: set[str] = set()
    for result in results:
        if result.rollout_id in rewards:
            raise ValueError(f"rollout {result.rollout_id} appears twice in group {result.group_id}")
        rewards[result.rollout_id] = result.reward
        group_ids.add(result.group_id)
    if len(group_ids) > 1:
        raise ValueError(f"results span several groups: {sorted(group_ids)}")
    if rollout_ids is None:
        return rewards
    missing = [rollout_id for rollout_id in rollout_ids if rollout_id not in rewards]
    foreign = sorted(set(rewards) - set(rollout_ids))
    if missing or foreign:
        raise ValueError(f"group {sorted(group_ids)}: results missing for {missing}, not members: {foreign}")
    return {rollout_id: rewards[rollout_id] for rollout_id in rollout_ids}


# -- the adapter --------------------------------------------------------------------------------------------


@dataclass
class _Tally:
    """Mutable counts while one rollout is adapted."""

    values: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, amount: int = 1) -> None:
        self.values[name] = self.values.get(name, 0) + amount


@dataclass
class _RowBuilder:
    """A row under construction: the first call's prompt, and the response grown by later calls."""

    prompt: tuple[int, ...]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    # (start, end) of each call's generated tokens in `response`, and the policy version that made them
    generated: list[tuple[int, int, int | None]] = field(default_factory=list)

    def sequence_length(self) -> int:
        return len(self.prompt) + len(self.response)

    def is_extended_by(self, prompt: tuple[int, ...]) -> bool:
        """Whether `prompt` starts with exactly this row's prompt + response."""
        n_prompt = len(self.prompt)
        return (
            len(prompt) >= self.sequence_length()
            and prompt[:n_prompt] == self.prompt
            and list(prompt[n_prompt : self.sequence_length()]) == self.response
        )

    def append_call(self, call: _UsableCall) -> None:
        inserted = call.prompt[self.sequence_length() :]
        self.response.extend(inserted)
        self.mask.extend([0] * len(inserted))
        self.log_probs.extend([0.0] * len(inserted))
        start = len(self.response)
        self.response.extend(call.response)
        self.mask.extend([1] * len(call.response))
        self.log_probs.extend(call.log_probs)
        self.generated.append((start, len(self.response), call.model_version))


@dataclass(frozen=True)
class _UsableCall:
    prompt: tuple[int, ...]
    response: tuple[int, ...]
    log_probs: tuple[float, ...]
    model_version: int | None


def adapt_rollout(
    events: EventsDocument | Mapping[str, Any], *, group_id: str, config: AdapterConfig
) -> AdapterResult:
    """Training rows of one terminal rollout, from its events document (parsed here if given as a dict).

    Raises `ValueError` for a rollout that is not terminal, a validation rollout, or one whose document names
    a different group than `group_id`; `pydantic.ValidationError` for a malformed document.
    """
    if not isinstance(events, EventsDocument):
        events = EventsDocument.model_validate(events)
    rollout = events.rollout
    if rollout.group_id is not None and rollout.group_id != group_id:
        raise ValueError(
            f"rollout {rollout.rollout_id} belongs to group {rollout.group_id}, not to group {group_id}"
        )
    if not rollout.state.is_terminal:
        raise ValueError(
            f"rollout {rollout.rollout_id} is {rollout.state}, not terminal: nothing to train on"
        )
    if rollout.mode != "train":
        raise ValueError(f"rollout {rollout.rollout_id} is a {rollout.mode} rollout and is never trained on")

    tally = _Tally()
    tally.add("rollouts")
    reward = rollout_reward(state=rollout.state, reward=rollout.reward, config=config)
    if rollout.state is not RolloutState.SUCCEEDED:
        tally.add("rollouts_failed")
    elif rollout.reward is None or not math.isfinite(rollout.reward):
        tally.add("rollouts_missing_reward")

    calls = _usable_calls(events, tally)
    if config.sample_level is SampleLevel.TRANSITION:
        builders = [_single_call_row(call) for call in calls]
    else:
        builders = _merge_conversations(calls, tally)

    rows: list[TrainingRow] = []
    for builder in builders:
        row = _finish_row(
            builder, rollout_id=rollout.rollout_id, group_id=group_id, reward=reward, config=config
        )
        if isinstance(row, TrainingRow):
            rows.append(row)
            tally.add("rows")
            tally.add("truncated_rows", int(row.truncated))
            tally.add("trained_tokens", sum(row.response_mask))
        else:
            tally.add(row)
    if not rows:
        tally.add("rollouts_without_rows")

    counts = AdapterCounts(**tally.values)
    if counts.calls != len(calls) or len(rows) != len(builders):
        logger.debug(
            "rollout %s: %d of %d calls used, %d of %d rows kept: %s",
            rollout.rollout_id,
            len(calls),
            counts.calls,
            len(rows),
            len(builders),
            {name: value for name, value in tally.values.items() if value},
        )
    return AdapterResult(
        rollout_id=rollout.rollout_id,
        group_id=group_id,
        state=rollout.state,
        reward=reward,
        rows=tuple(rows),
        counts=counts,
    )


def _usable_calls(events: EventsDocument, tally: _Tally) -> list[_UsableCall]:
    """The calls that can be trained on, ordered by `started_at` (stable for ties); the others counted."""
    usable: list[_UsableCall] = []
    final_attempt = events.rollout.attempt_id
    for call in sorted(events.model_calls, key=lambda call: call.started_at):
        tally.add("calls")
        if final_attempt is not None and call.attempt_id is not None and call.attempt_id != final_attempt:
            tally.add("dropped_calls_other_attempt")
        elif call.status != SUCCESS_STATUS or call.aborted:  # an aborted call's tokens are incomplete
            tally.add("dropped_calls_failed")
        elif call.prompt_token_ids is None or call.response_token_ids is None:
            tally.add("dropped_calls_without_tokens")
        elif (
            call.response_logprobs is None
            or len(call.response_logprobs) != len(call.response_token_ids)
            or not all(math.isfinite(value) for value in call.response_logprobs)
        ):
            tally.add("dropped_calls_without_logprobs")
        else:
            usable.append(
                _UsableCall(
                    prompt=call.prompt_token_ids,
                    response=call.response_token_ids,
                    log_probs=call.response_logprobs,
                    model_version=call.model_version,
                )
            )
    return usable


def _single_call_row(call: _UsableCall) -> _RowBuilder:
    builder = _RowBuilder(prompt=call.prompt)
    builder.append_call(call)
    return builder


def _merge_conversations(calls: Sequence[_UsableCall], tally: _Tally) -> list[_RowBuilder]:
    """Trajectory rows: each call extends the open row it continues (the longest such), or starts a new one.

    Matching against every open row, not just the latest, keeps interleaved conversations of one agent (say,
    a planner and a sub-agent taking turns) in one row each instead of breaking at every switch.
    """
    builders: list[_RowBuilder] = []
    for call in calls:
        extended = [builder for builder in builders if builder.is_extended_by(call.prompt)]
        if extended:
            # Longest sequence wins; among equals, the most recently started row.
            target = max(reversed(extended), key=_RowBuilder.sequence_length)
            target.append_call(call)
            continue
        if builders:
            tally.add("trajectory_breaks")
        builders.append(_single_call_row(call))
    return builders


def _finish_row(
    builder: _RowBuilder, *, rollout_id: str, group_id: str, reward: float, config: AdapterConfig
) -> TrainingRow | str:
    """The finished row, or the name of the count that records why it was dropped."""
    if len(builder.prompt) > config.max_prompt_tokens:
        return "dropped_long_prompt"
    limit = config.max_response_tokens
    truncated = len(builder.response) > limit
    mask = builder.mask[:limit]
    if 1 not in mask:
        return "dropped_rows_without_trained_tokens"
    # The oldest version among calls whose generated tokens survived truncation; unknown if any is unknown.
    versions = [version for start, end, version in builder.generated if start < min(end, limit)]
    return TrainingRow(
        rollout_id=rollout_id,
        group_id=group_id,
        prompt_token_ids=builder.prompt,
        response_token_ids=tuple(builder.response[:limit]),
        response_mask=tuple(mask),
        rollout_log_probs=tuple(builder.log_probs[:limit]),
        reward=reward,
        model_version=None if None in versions else min(v for v in versions if v is not None),
        truncated=truncated,
    )
