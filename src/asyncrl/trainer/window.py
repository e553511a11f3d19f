"""The async rollout window: which prompt groups are in flight, when an update may run, what carries over.

Collocated asynchronous training keeps more prompt groups in flight than one update consumes, updates as soon
as enough of them are complete, and carries the rest into later steps (SPEC contract 1-5 and 8, and bounded
staleness). These rules decide what the optimizer sees, so they live here as plain Python without I/O: the
step loop feeds in the terminal states it hears from the gateway and acts on the window's answers (draw this
many prompts, cancel these stale groups, train on this batch). Both training backends share this one engine,
and property-based tests pin its invariants.

Steps are 0-based optimizer steps that increase by 1 per update. One step runs, in this order:
`begin_step` → `apply_staleness_policy` → `groups_to_draw` / `add_group` → `record_terminal` ... →
`take_update_batch`. Terminal states may be recorded at any time, also between steps.

A group's carry-over age is the number of updates since it was enqueued: a group enqueued during step `s` is
0 steps old while step `s` runs, 1 step old once the update of step `s` carried it over, 2 after step `s + 1`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from asyncrl import metric_names as names
from asyncrl.rollouts import RolloutState
from asyncrl.window_config import StalenessPolicy, WindowConfig
from asyncrl.window_summary import WindowSummary


@dataclass
class Group:
    """One prompt's `samples_per_prompt` sibling rollouts: the unit the window draws, carries and consumes.

    Only terminal states are recorded; the first terminal state reported for a rollout is the one kept.
    `completion_sequence` is set when the last sibling finishes and orders groups by completion.
    """

    group_id: str
    enqueued_step: int
    rollout_ids: tuple[str, ...]
    terminal_states: dict[str, RolloutState] = field(default_factory=dict)
    completion_sequence: int | None = None

    def __post_init__(self) -> None:
        if self.enqueued_step < 0:
            raise ValueError(f"group {self.group_id}: enqueued_step {self.enqueued_step} is negative")
        if not self.rollout_ids or len(set(self.rollout_ids)) != len(self.rollout_ids):
            raise ValueError(f"group {self.group_id}: rollout ids must be non-empty and distinct")
        unknown = set(self.terminal_states) - set(self.rollout_ids)
        if unknown:
            raise ValueError(f"group {self.group_id}: states recorded for foreign rollouts {sorted(unknown)}")
        if any(not state.is_terminal for state in self.terminal_states.values()):
            raise ValueError(f"group {self.group_id}: only terminal states may be recorded")
        if self.completion_sequence is not None and not self.is_complete:
            raise ValueError(f"group {self.group_id}: has a completion sequence but is not complete")

    @property
    def is_complete(self) -> bool:
        """Every sibling reached a terminal state (GRPO/RLOO need the whole group)."""
        return len(self.terminal_states) == len(self.rollout_ids)

    @property
    def n_finished(self) -> int:
        return len(self.terminal_states)

    @property
    def n_failed(self) -> int:
        """Siblings that ended failed, timed out or cancelled."""
        return sum(state is not RolloutState.SUCCEEDED for state in self.terminal_states.values())

    def age_steps(self, current_step: int) -> int:
        """Updates since this group was enqueued, as of the start of `current_step`."""
        return current_step - self.enqueued_step


class TerminalOutcome(StrEnum):
    """What recording one terminal state did to the window."""

    GROUP_COMPLETED = "group_completed"  # the last sibling of its group finished
    RECORDED = "recorded"  # recorded; siblings are still running
    DUPLICATE = "duplicate"  # already terminal; nothing changed (reports are idempotent)
    UNKNOWN = "unknown"  # not in the window, e.g. its group was consumed or cancelled


@dataclass(frozen=True, kw_only=True)
class StepSummary:
    """What one update did to the window: the six seed metrics and the carry-over detail behind them."""

    step: int
    n_prev_carry_over_rollouts: int  # rollouts in the window when the step began
    n_completed_rollouts: int  # rollouts in the consumed groups
    n_new_carry_over_rollouts: int  # rollouts in the groups carried into the next step
    new_carry_over_age_max_steps: int  # oldest carried group's age; 0 when nothing is carried
    carry_over_age_histogram: dict[int, int]  # age in steps -> carried groups of that age
    n_stale_groups_cancelled: int
    n_stale_groups_kept: int  # stale groups left in the window by the KEEP policy
    n_failed_rollouts_consumed: int  # failed, timed-out or cancelled rollouts in consumed groups
    n_uniform_groups_dropped: int = 0  # complete groups skipped for rewards all alike (dropUniformGroups)
    proxy_inflight_at_pause: int = 0
    proxy_drain_seconds: float = 0.0
    proxy_aborted_calls: int = 0  # calls in flight at the pause cancelled upstream (drain policy Abort)

    def with_drain(
        self, *, inflight_at_pause: int, drain_seconds: float, aborted_calls: int = 0
    ) -> StepSummary:
        """This summary with the gateway's pause-and-drain measurements filled in."""
        return dataclasses.replace(
            self,
            proxy_inflight_at_pause=inflight_at_pause,
            proxy_drain_seconds=drain_seconds,
            proxy_aborted_calls=aborted_calls,
        )

    def window_summary(
        self,
        *,
        active_groups: int,
        reward_mean: float | None,
        step_seconds: float | None,
        total_steps: int | None = None,
        steps_in_process: int | None = None,
    ) -> WindowSummary:
        """What the gateway keeps for the operator and local mode: the same values, as typed fields."""
        return WindowSummary(
            step=self.step,
            active_groups=active_groups,
            carry_over_age_histogram={str(age): n for age, n in self.carry_over_age_histogram.items()},
            prev_carry_over_rollouts=self.n_prev_carry_over_rollouts,
            completed_rollouts=self.n_completed_rollouts,
            new_carry_over_rollouts=self.n_new_carry_over_rollouts,
            carry_over_age_max_steps=self.new_carry_over_age_max_steps,
            proxy_inflight_at_pause=self.proxy_inflight_at_pause,
            proxy_drain_seconds=self.proxy_drain_seconds,
            proxy_aborted_calls=self.proxy_aborted_calls,
            reward_mean=reward_mean,
            step_seconds=step_seconds,
            total_steps=total_steps,
            steps_in_process=steps_in_process,
        )

    def metrics(self) -> dict[str, float]:
        """The step's metrics under the `training/async/` names (W&B and Prometheus)."""
        values = {
            "n_prev_carry_over_rollouts": self.n_prev_carry_over_rollouts,
            "n_completed_rollouts": self.n_completed_rollouts,
            "n_new_carry_over_rollouts": self.n_new_carry_over_rollouts,
            "new_carry_over_age_max_steps": self.new_carry_over_age_max_steps,
            "proxy_inflight_at_pause": self.proxy_inflight_at_pause,
            "proxy_drain_seconds": self.proxy_drain_seconds,
            "proxy_aborted_calls": self.proxy_aborted_calls,
            "n_stale_groups_cancelled": self.n_stale_groups_cancelled,
            "n_stale_groups_kept": self.n_stale_groups_kept,
            "n_failed_rollouts_consumed": self.n_failed_rollouts_consumed,
            "n_uniform_groups_dropped": self.n_uniform_groups_dropped,
        }
        return {names.ASYNC + name: float(value) for name, value in values.items()}


@dataclass(frozen=True, kw_only=True)
class UpdateBatch:
    """The groups one update trains on, the groups it carries over (snapshots), and its summary."""

    step: int
    consumed: tuple[Group, ...]
    carried_over: tuple[Group, ...]
    summary: StepSummary


class RolloutWindow:
    """The active prompt groups of a run and the rules for drawing, completing, consuming and aging them."""

    def __init__(self, config: WindowConfig) -> None:
        self._config = config
        self._groups: dict[str, Group] = {}  # enqueue order
        self._group_of_rollout: dict[str, Group] = {}
        self._next_completion_sequence = 0
        self._step: int | None = None  # the begun step; None between steps
        self._last_update_step: int | None = None
        self._n_prev_carry_over_rollouts = 0
        self._n_stale_groups_cancelled = 0
        self._n_stale_groups_kept = 0
        self._n_uniform_groups_dropped = 0

    @classmethod
    def restore(cls, config: WindowConfig, groups: Iterable[Group]) -> RolloutWindow:
        """Rebuild the window after a trainer restart from the groups the gateway still holds.

        Groups are copied. Complete groups keep their relative completion order; complete groups without a
        completion sequence count as completed after those with one, in the order given. No step is begun:
        the next `begin_step` may be any step not earlier than the newest group's enqueue step.
        """
        window = cls(config)
        restored = [_snapshot(group) for group in groups]
        for group in restored:
            window._insert(group)
        complete = [group for group in restored if group.is_complete]
        complete.sort(key=lambda group: (group.completion_sequence is None, group.completion_sequence or 0))
        for sequence, group in enumerate(complete):
            group.completion_sequence = sequence
        window._next_completion_sequence = len(complete)
        return window

    @property
    def config(self) -> WindowConfig:
        return self._config

    @property
    def current_step(self) -> int | None:
        """The begun step, or None between `take_update_batch` and the next `begin_step`."""
        return self._step

    @property
    def active_groups(self) -> tuple[Group, ...]:
        """The groups in the window, in enqueue order. The window owns them: read, do not modify."""
        return tuple(self._groups.values())

    @property
    def n_active_rollouts(self) -> int:
        return len(self._group_of_rollout)

    @property
    def n_complete_groups(self) -> int:
        return sum(group.is_complete for group in self._groups.values())

    def begin_step(self, *, step: int) -> None:
        """Start `step`: remember how many rollouts were carried into it. Steps go up by 1 per update."""
        if self._step is not None:
            raise RuntimeError(f"cannot begin step {step}: step {self._step} has not taken its update batch")
        if self._last_update_step is not None and step != self._last_update_step + 1:
            raise ValueError(f"cannot begin step {step}: the last update was step {self._last_update_step}")
        newest = max((group.enqueued_step for group in self._groups.values()), default=0)
        if step < newest:
            raise ValueError(f"cannot begin step {step}: the window holds a group enqueued in step {newest}")
        self._step = step
        self._n_prev_carry_over_rollouts = self.n_active_rollouts
        self._n_stale_groups_cancelled = 0
        self._n_stale_groups_kept = 0
        self._n_uniform_groups_dropped = 0

    @property
    def n_uniform_groups_dropped(self) -> int:
        """Complete groups `drop_uniform_groups` removed in the begun step."""
        return self._n_uniform_groups_dropped

    def stale_groups(self, *, step: int) -> list[Group]:
        """Active groups older than `max_carry_over_age_steps` at the start of `step` (none without a max)."""
        max_age = self._config.max_carry_over_age_steps
        if max_age is None:
            return []
        return [group for group in self._groups.values() if group.age_steps(step) > max_age]

    def apply_staleness_policy(self, *, step: int) -> list[Group]:
        """Apply the policy to the stale groups; return the ones removed, whose rollouts the caller cancels.

        With CANCEL the next `groups_to_draw` replaces them with fresh prompts; with KEEP nothing changes.
        """
        self._require_step(step, action="apply the staleness policy")
        stale = self.stale_groups(step=step)
        if self._config.staleness_policy is StalenessPolicy.KEEP:
            self._n_stale_groups_kept = len(stale)
            return []
        for group in stale:
            self._remove(group)
        self._n_stale_groups_cancelled += len(stale)
        return stale

    @property
    def n_unfinished_groups(self) -> int:
        return len(self._groups) - self.n_complete_groups

    def groups_to_draw(self) -> int:
        """New prompt groups to draw now: fill the async window; sync mode draws a batch into an empty one.

        Refilled during collection, the window is filled up to window_size unfinished groups (within
        max_groups), so call this again after completions; otherwise only when a step begins.
        """
        config = self._config
        if config.refills:
            room = config.max_groups - len(self._groups)
            return max(0, min(config.window_size - self.n_unfinished_groups, room))
        if config.async_enabled:
            return max(0, config.window_size - len(self._groups))
        return config.train_batch_size if not self._groups else 0

    def add_group(self, *, group_id: str, rollout_ids: Iterable[str], step: int) -> Group:
        """Enqueue a new prompt group of exactly `samples_per_prompt` rollouts during the begun `step`."""
        self._require_step(step, action=f"add group {group_id}")
        group = Group(group_id=group_id, enqueued_step=step, rollout_ids=tuple(rollout_ids))
        self._insert(group)
        return group

    def record_terminal(self, rollout_id: str, state: RolloutState) -> TerminalOutcome:
        """Record that a rollout ended; idempotent, and the first terminal state reported wins."""
        if not state.is_terminal:
            raise ValueError(f"rollout {rollout_id}: {state} is not a terminal state")
        group = self._group_of_rollout.get(rollout_id)
        if group is None:
            return TerminalOutcome.UNKNOWN
        if rollout_id in group.terminal_states:
            return TerminalOutcome.DUPLICATE
        group.terminal_states[rollout_id] = state
        if not group.is_complete:
            return TerminalOutcome.RECORDED
        group.completion_sequence = self._next_completion_sequence
        self._next_completion_sequence += 1
        return TerminalOutcome.GROUP_COMPLETED

    def ready_for_update(self) -> bool:
        """Async: trainBatchSize groups are complete. Sync: a full batch of groups, every one complete."""
        if self._config.async_enabled:
            return self.n_complete_groups >= self._config.train_batch_size
        return len(self._groups) == self._config.train_batch_size and all(
            group.is_complete for group in self._groups.values()
        )

    def update_groups(self) -> tuple[Group, ...]:
        """The groups `take_update_batch` would consume now, in completion order (none when not ready).

        The caller fetches their data before committing the update, so a failure while fetching leaves the
        window as it was and the step can continue.
        """
        if not self.ready_for_update():
            return ()
        complete = sorted(
            (group for group in self._groups.values() if group.is_complete), key=_completion_order
        )
        return tuple(complete[: self._config.train_batch_size])

    def drop_groups(self, group_ids: Iterable[str]) -> list[Group]:
        """Remove these groups (e.g. their rollouts were lost with a restarted gateway); return them.

        Allowed at any time; unknown ids are ignored. The caller redraws their prompts as new groups.
        """
        dropped = [
            self._groups[group_id] for group_id in dict.fromkeys(group_ids) if group_id in self._groups
        ]
        for group in dropped:
            self._remove(group)
        return dropped

    def drop_uniform_groups(self, group_ids: Iterable[str], *, step: int) -> list[Group]:
        """Remove complete groups whose rewards were all alike (no GRPO signal) before the update; return
        them.

        Counted in the step's summary. The caller deletes their rollouts and draws new prompts in their place.
        """
        self._require_step(step, action="drop uniform groups")
        wanted = list(dict.fromkeys(group_ids))
        unfinished = [gid for gid in wanted if gid in self._groups and not self._groups[gid].is_complete]
        if unfinished:
            raise ValueError(f"groups {unfinished} are not complete: their rewards are not all known")
        dropped = self.drop_groups(wanted)
        self._n_uniform_groups_dropped += len(dropped)
        return dropped

    def take_update_batch(self, *, step: int) -> UpdateBatch:
        """Consume the first trainBatchSize complete groups in completion order; carry every other group over.

        Carried groups (complete ones beyond the batch included) stay in the window; their age after this
        update is `step + 1 - enqueued_step`. Ends the step: the next call is `begin_step(step=step + 1)`.
        """
        self._require_step(step, action="take an update batch")
        if not self.ready_for_update():
            raise RuntimeError(
                f"step {step} is not ready for an update: {self.n_complete_groups} of {len(self._groups)} "
                f"active groups complete, {self._config.train_batch_size} needed"
                + ("" if self._config.async_enabled else " and every group complete (sync mode)")
            )
        consumed = self.update_groups()
        for group in consumed:
            self._remove(group)
        carried_over = tuple(_snapshot(group) for group in self._groups.values())
        ages = Counter(group.age_steps(step + 1) for group in carried_over)
        summary = StepSummary(
            step=step,
            n_prev_carry_over_rollouts=self._n_prev_carry_over_rollouts,
            n_completed_rollouts=sum(len(group.rollout_ids) for group in consumed),
            n_new_carry_over_rollouts=self.n_active_rollouts,
            new_carry_over_age_max_steps=max(ages, default=0),
            carry_over_age_histogram=dict(sorted(ages.items())),
            n_stale_groups_cancelled=self._n_stale_groups_cancelled,
            n_stale_groups_kept=self._n_stale_groups_kept,
            n_failed_rollouts_consumed=sum(group.n_failed for group in consumed),
            n_uniform_groups_dropped=self._n_uniform_groups_dropped,
        )
        self._step = None
        self._last_update_step = step
        return UpdateBatch(step=step, consumed=consumed, carried_over=carried_over, summary=summary)

    def _require_step(self, step: int, *, action: str) -> None:
        if self._step is None:
            raise RuntimeError(f"cannot {action} for step {step}: begin_step(step={step}) was not called")
        if step != self._step:
            raise RuntimeError(f"cannot {action} for step {step}: step {self._step} is in progress")

    def _insert(self, group: Group) -> None:
        size, n = len(group.rollout_ids), self._config.samples_per_prompt
        if size != n:
            raise ValueError(
                f"group {group.group_id} has {size} rollouts; rollout.samplesPerPrompt requires exactly {n}"
            )
        if group.group_id in self._groups:
            raise ValueError(f"group {group.group_id} is already in the window")
        taken = [rollout_id for rollout_id in group.rollout_ids if rollout_id in self._group_of_rollout]
        if taken:
            raise ValueError(f"group {group.group_id}: rollouts {taken} are already in the window")
        if len(self._groups) >= self._config.max_groups:
            raise ValueError(
                f"cannot add group {group.group_id}: the window is full ({self._config.max_groups} groups)"
            )
        self._groups[group.group_id] = group
        for rollout_id in group.rollout_ids:
            self._group_of_rollout[rollout_id] = group

    def _remove(self, group: Group) -> None:
        del self._groups[group.group_id]
        for rollout_id in group.rollout_ids:
            del self._group_of_rollout[rollout_id]


def _snapshot(group: Group) -> Group:
    return dataclasses.replace(group, terminal_states=dict(group.terminal_states))


def _completion_order(group: Group) -> int:
    if group.completion_sequence is None:
        raise AssertionError(f"group {group.group_id} is complete but has no completion sequence")
    return group.completion_sequence
