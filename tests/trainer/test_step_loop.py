"""The step loop's logic, driven directly against an in-memory gateway (a fake: fast unit tests, no process).

`FakeGateway` (tests/trainer/fake_gateway.py) keeps the gateway's real store, pause state and wire models but
no HTTP and no agents: each test finishes rollouts itself, at chosen moments, so what the loop draws, trains,
carries over, drops and redraws is exact, not statistical. The backend is the recording stand-in of
test_restarts.py. The same behaviour against the real gateway process is in test_restarts.py and
test_prefetch_loop.py (slow).

Groups are named by creation order below: g0 is the first group the loop created, g4 the fifth.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.api.types.spec import AsyncSpec
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import AdapterConfig
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.failures import RunFailed
from asyncrl.trainer.loop import LoopSettings, RunResult, StepLoop
from asyncrl.trainer.metrics import JsonLinesSink, MetricsSinks
from tests.trainer.fake_gateway import FakeGateway
from tests.trainer.test_restarts import MODEL, RecordingBackend

TRAIN_BATCH = 2
SAMPLES = 2
WINDOW = 4
ROWS = [{"prompt": f"p{index}"} for index in range(40)]
UPSTREAM = "http://127.0.0.1:9"  # registered with the gateway, never called: no agent reaches a model here
RUN_GUARD_SECONDS = 20.0  # only against a hung loop (a defect): every run here takes well under a second


def _settings(*, steps: int, max_age: int | None = None) -> LoopSettings:
    return LoopSettings(
        window=AsyncSpec(
            enabled=True, window_size=WINDOW, max_carry_over_age_steps=max_age, refill_during_collection=False
        ).window_config(train_batch_size=TRAIN_BATCH, samples_per_prompt=SAMPLES),
        adapter=AdapterConfig(),
        rollout_timeout_seconds=60,
        total_steps=steps,
        checkpoint_dir=None,
        checkpoint_every_steps=1,
        retry_after_seconds=1,
        drain_timeout_seconds=30,
        gateway_wait_seconds=5,
        events_batch_rollouts=3,
    )


@dataclasses.dataclass
class Harness:
    gateway: FakeGateway
    backend: RecordingBackend
    loop: StepLoop
    metrics_path: Path

    def group(self, ordinal: int) -> str:
        """The id of the `ordinal`-th group the loop created (g0, g1, ...)."""
        return self.gateway.group_ids[ordinal]

    def groups(self, *ordinals: int) -> tuple[str, ...]:
        return tuple(sorted(self.group(ordinal) for ordinal in ordinals))

    def rollouts_of(self, groups: Sequence[str]) -> list[str]:
        """Every rollout the loop created for these groups, sorted."""
        return sorted(created.rollout_id for created in self.gateway.created if created.group_id in groups)

    def trained_groups(self) -> list[str]:
        return [group for _, groups in self.backend.updates for group in groups]

    def metrics(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines()]


def _harness(tmp_path: Path, settings: LoopSettings, gateway: FakeGateway | None = None) -> Harness:
    gateway, backend = gateway or FakeGateway(), RecordingBackend(UPSTREAM)
    metrics_path = tmp_path / "metrics.jsonl"
    loop = StepLoop(
        settings=settings,
        gateway=gateway,
        backend=backend,
        prompts=PromptSource(ROWS, shuffle=False, seed=0),
        sinks=MetricsSinks([JsonLinesSink(metrics_path)]),
    )
    return Harness(gateway=gateway, backend=backend, loop=loop, metrics_path=metrics_path)


def _agents(
    harness: Harness,
    *,
    hold: Callable[[int], bool] = lambda ordinal: False,
    reverse: bool = False,
    outcome: Callable[[int], RolloutState] = lambda ordinal: RolloutState.SUCCEEDED,
) -> Callable[[Sequence[str]], None]:
    """Agents that finish each new group as soon as it is created (in reverse creation order with
    `reverse`), except the groups whose creation ordinal `hold` selects: those wait for the test. A group's
    rollouts end in the state `outcome` gives its ordinal."""

    def finish(group_ids: Sequence[str]) -> None:
        for group_id in reversed(group_ids) if reverse else group_ids:
            ordinal = harness.gateway.group_ids.index(group_id)
            if not hold(ordinal):
                harness.gateway.finish_group(group_id, state=outcome(ordinal))

    return finish


def _finish_during_update(harness: Harness, *, ordinal: int, step: int) -> Callable[[int], None]:
    """The agents of group `ordinal` finish while the update of `step` runs."""

    def finish(updating: int) -> None:
        if updating == step:
            harness.gateway.finish_group(harness.group(ordinal))

    return finish


def _run(harness: Harness) -> RunResult:
    async def main() -> RunResult:
        try:
            return await asyncio.wait_for(harness.loop.run(), timeout=RUN_GUARD_SECONDS)
        except TimeoutError:
            raise AssertionError(f"the loop hung: no end after {RUN_GUARD_SECONDS:.0f}s") from None
        finally:
            harness.loop.sinks.close()

    return asyncio.run(main())


# -- what each step trains ----------------------------------------------------------------------------------


def test_every_step_trains_train_batch_whole_groups_in_completion_order_and_never_one_twice(
    tmp_path: Path,
) -> None:
    harness = _harness(tmp_path, _settings(steps=4))
    harness.gateway.on_groups_created = _agents(harness)

    result = _run(harness)

    assert (result.first_step, result.next_step, result.steps_run) == (0, 4, 4)
    # Groups finish in creation order here, so step s trains g(2s), g(2s+1): the earliest completed.
    assert harness.backend.updates == [(step, harness.groups(2 * step, 2 * step + 1)) for step in range(4)]
    trained = harness.trained_groups()
    assert len(trained) == len(set(trained)) == 4 * TRAIN_BATCH
    assert sorted(harness.backend.trained_rollouts) == harness.rollouts_of(trained)  # every sibling, once
    # Consumed rollouts left the gateway; what it still holds is the window carried past the last step.
    held = {rollout.group_id for rollout in harness.gateway.instance.store.select()}
    assert held == {harness.group(8), harness.group(9)}
    summaries = harness.gateway.instance.summaries
    assert [summary.step for summary in summaries] == [0, 1, 2, 3]
    assert all(summary.completed_rollouts == TRAIN_BATCH * SAMPLES for summary in summaries)


def test_a_group_completed_during_the_update_is_carried_over_with_its_age_and_trained_next(
    tmp_path: Path,
) -> None:
    harness = _harness(tmp_path, _settings(steps=2))
    # g2 and g3 are held; the others finish as soon as they are created, the newest first.
    harness.gateway.on_groups_created = _agents(harness, hold=lambda ordinal: ordinal in (2, 3), reverse=True)
    harness.backend.during_update = _finish_during_update(harness, ordinal=2, step=0)

    _run(harness)

    g = harness.group
    # Step 0 trains g0, g1 and carries g2 (completed during its update) and g3 (running), both 1 step old.
    # Step 1 draws g4, g5 (g5 completes first) and trains the earliest completed: g2 and g5, not g4.
    assert harness.backend.updates == [(0, harness.groups(0, 1)), (1, harness.groups(2, 5))]
    first, second = harness.gateway.instance.summaries
    assert (first.new_carry_over_rollouts, first.carry_over_age_histogram) == (2 * SAMPLES, {"1": 2})
    assert first.carry_over_age_max_steps == 1
    # Carried into step 2: g3, now 2 steps old, and g4 (complete, 1 step old).
    assert (second.prev_carry_over_rollouts, second.new_carry_over_rollouts) == (2 * SAMPLES, 2 * SAMPLES)
    assert second.carry_over_age_histogram == {"1": 1, "2": 1}
    assert second.carry_over_age_max_steps == 2
    assert [line["training/async/n_prev_carry_over_rollouts"] for line in harness.metrics()] == [0, 4]
    # The run's end cancels what is still running (g3) and leaves finished rollouts (g4) as they are.
    assert set(harness.gateway.rollout_states(g(3)).values()) == {RolloutState.CANCELLED}
    assert set(harness.gateway.rollout_states(g(4)).values()) == {RolloutState.SUCCEEDED}


def test_a_group_older_than_the_staleness_limit_is_dropped_not_trained(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=3, max_age=1))
    harness.gateway.on_groups_created = _agents(harness, hold=lambda ordinal: ordinal in (2, 3))
    # g2 completes during step 1's update: complete, but 2 steps old when step 2 begins (the limit is 1).
    harness.backend.during_update = _finish_during_update(harness, ordinal=2, step=1)

    _run(harness)

    g = harness.group
    assert harness.backend.updates == [
        (0, harness.groups(0, 1)),
        (1, harness.groups(4, 5)),
        (2, harness.groups(6, 7)),  # g2 completed before g6, g7 were drawn, but it was stale
    ]
    assert harness.gateway.instance.summaries[1].carry_over_age_histogram == {"2": 2}
    assert [line["training/async/n_stale_groups_cancelled"] for line in harness.metrics()] == [0, 0, 2]
    # The stale group still running (g3) is cancelled at the gateway (the feed says so, for the operator to
    # delete its Jobs); then both stale groups are deleted, so their captured calls do not stay in memory.
    cancelled = {
        entry.rollout_id for entry in harness.gateway.feed() if entry.state is RolloutState.CANCELLED
    }
    assert set(harness.gateway.created_ids(g(3))) <= cancelled
    assert not cancelled & set(harness.gateway.created_ids(g(2)))  # finished before: keeps its outcome
    assert harness.gateway.rollout_states(g(3)) == harness.gateway.rollout_states(g(2)) == {}


def test_a_cursor_older_than_the_feed_keeps_is_resynced_from_the_listing(tmp_path: Path) -> None:
    # The feed keeps 2 completions; the 4 or 8 of a step make the loop's cursor too old (410).
    harness = _harness(tmp_path, _settings(steps=3), FakeGateway(max_feed_entries=2))
    harness.gateway.on_groups_created = _agents(harness)

    _run(harness)

    assert harness.backend.updates == [(step, harness.groups(2 * step, 2 * step + 1)) for step in range(3)]
    polls = [call.method for call in harness.gateway.calls if call.method in ("completions", "list_rollouts")]
    # The start lists the rollouts once. Steps 0 and 2 wait for completions, get 410 and read the listing
    # instead; step 1 needs no poll (the listing of step 0 showed g2, g3 complete).
    assert polls == ["list_rollouts"] + ["completions", "list_rollouts"] * 2


def test_steps_without_a_succeeded_rollout_fail_the_run_at_max_failed_steps_in_a_row(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=10))
    # Every agent fails except g2's, which step 1 trains: the count of failed steps starts again there.
    harness.gateway.on_groups_created = _agents(
        harness, outcome=lambda ordinal: RolloutState.SUCCEEDED if ordinal == 2 else RolloutState.FAILED
    )

    with pytest.raises(RunFailed, match=r"3 consecutive steps \(up to step 4\)"):
        _run(harness)

    assert [step for step, _ in harness.backend.updates] == [0, 1, 2, 3, 4]  # failed rollouts still train
    assert harness.backend.updates[1] == (1, harness.groups(2, 3))


# -- the gateway restarting under the loop ------------------------------------------------------------------


def test_a_gateway_restarted_during_an_update_is_noticed_by_its_instance_id_and_lost_groups_are_redrawn(
    tmp_path: Path,
) -> None:
    harness = _harness(tmp_path, _settings(steps=4))
    gateway = harness.gateway
    gateway.on_groups_created = _agents(harness)
    lost: list[str] = []

    def restart_during_step_1(step: int) -> None:
        if step == 1:  # no call is in flight: only the next stats call can tell
            lost.extend(group.group_id for group in harness.loop.window.active_groups)
            gateway.restart()

    harness.backend.during_update = restart_during_step_1

    result = _run(harness)

    g = harness.group
    assert result.next_step == 4
    assert lost == [g(4), g(5)]  # drawn in step 1, carried: the restarted gateway no longer holds them
    trained = harness.trained_groups()
    assert not set(lost) & set(trained)
    assert len(trained) == len(set(trained)) == 4 * TRAIN_BATCH
    # Step 2 redraws them first, as new groups from the same prompts, and trains those.
    inputs = gateway.inputs()
    assert [inputs[g(6)], inputs[g(7)]] == [inputs[g(4)], inputs[g(5)]]
    assert harness.backend.updates[2] == (2, harness.groups(6, 7))
    # The new gateway got the model servers again, and the weights' version on its first resume.
    assert gateway.instance.number == 1
    assert (gateway.instance.upstreams, gateway.instance.model) == ((UPSTREAM,), MODEL)
    first_resume = next(call for call in gateway.calls if call.instance == 1 and call.method == "resume")
    assert first_resume.model_version == 2


def test_a_gateway_lost_under_a_long_poll_is_adopted_and_lost_groups_are_redrawn(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=4))
    gateway = harness.gateway
    # The first gateway's agents finish only g0-g3, so step 2 waits on the feed; the second's finish all.
    gateway.on_groups_created = _agents(
        harness, hold=lambda ordinal: gateway.instance.number == 0 and ordinal >= 4
    )
    lost: list[str] = []

    def kill_the_first_gateway() -> None:
        if gateway.instance.number == 0:
            lost.extend(group.group_id for group in harness.loop.window.active_groups)
            gateway.restart()

    gateway.on_long_poll = kill_the_first_gateway

    result = _run(harness)

    g = harness.group
    assert result.next_step == 4
    assert lost == [g(4), g(5), g(6), g(7)]
    assert [call.method for call in gateway.calls if call.instance == 0][-1] == "completions"  # cut off
    trained = harness.trained_groups()
    assert not set(lost) & set(trained)
    assert len(trained) == len(set(trained)) == 4 * TRAIN_BATCH
    inputs = gateway.inputs()
    assert [inputs[g(ordinal)] for ordinal in range(8, 12)] == [inputs[group] for group in lost]
    assert harness.backend.updates[2:] == [(2, harness.groups(8, 9)), (3, harness.groups(10, 11))]
    assert (gateway.instance.upstreams, gateway.instance.model) == ((UPSTREAM,), MODEL)


# -- pause and resume ---------------------------------------------------------------------------------------


def test_each_update_runs_paused_and_the_resume_names_the_new_model_version(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=3))
    gateway = harness.gateway
    gateway.on_groups_created = _agents(harness)
    paused_during_update: list[bool] = []
    harness.backend.during_update = lambda step: paused_during_update.append(gateway.instance.pause.paused)

    _run(harness)

    assert paused_during_update == [True, True, True]
    pauses_and_resumes = [
        (call.method, call.model_version) for call in gateway.calls if call.method in ("pause", "resume")
    ]
    assert pauses_and_resumes == [
        ("resume", 0),  # the run starts serving the initial weights
        ("pause", None),
        ("resume", 1),
        ("pause", None),
        ("resume", 2),
        ("pause", None),
        ("resume", 3),
        ("resume", 3),  # the run's end
    ]
    state = gateway.instance.pause
    assert (state.paused, state.model_version) == (False, 3)


def _pauses_and_resumes(gateway: FakeGateway) -> list[tuple[str, bool, int | None]]:
    """(method, whether the gateway was paused when the call came, the resume's model version), in order."""
    return [
        (call.method, call.paused, call.model_version)
        for call in gateway.calls
        if call.method in ("pause", "resume")
    ]


class PauseAnswerLostGateway(FakeGateway):
    """Its first pause is taken but the answer never reaches the trainer (a reset or timed-out connection)."""

    lost = 0

    async def pause(self, **kwargs: Any) -> Any:
        result = await super().pause(**kwargs)
        if not self.lost:
            self.lost += 1
            raise httpx.ReadTimeout("the pause's answer was lost")
        return result


def test_a_step_whose_pause_answer_was_lost_updates_within_that_pause(tmp_path: Path) -> None:
    """The lost pause did pause the gateway, and the retried step's window is still ready: it updates within
    that pause. Before, it resumed the gateway first and paused it again, so a pause ended with no update in
    it (the CI soak of 6cb12d2 counted one)."""
    gateway = PauseAnswerLostGateway()
    harness = _harness(tmp_path, _settings(steps=2), gateway)
    gateway.on_groups_created = _agents(harness)
    paused_during_update: list[bool] = []
    harness.backend.during_update = lambda step: paused_during_update.append(gateway.instance.pause.paused)

    _run(harness)

    assert gateway.lost == 1
    assert _pauses_and_resumes(gateway)[:4] == [
        ("resume", False, 0),  # the run starts serving
        ("pause", False, None),  # step 0's pause: taken, its answer lost
        ("pause", True, None),  # the retry pauses again (idempotent), without resuming in between
        ("resume", True, 1),  # after step 0's update
    ]
    assert [step for step, _ in harness.backend.updates] == [0, 1]
    assert paused_during_update == [True, True]


class PauseAnswerLostGroupLostGateway(PauseAnswerLostGateway):
    """Its first pause is taken, its answer lost, and the complete groups are gone from the gateway: the
    retried step redraws them and must wait for them."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[str] = []

    async def pause(self, **kwargs: Any) -> Any:
        if not self.lost:
            states = {group: self.rollout_states(group).values() for group in self.group_ids}
            self.dropped = [group for group, ended in states.items() if all(s.is_terminal for s in ended)]
            self.instance.store.delete(rid for group in self.dropped for rid in self.created_ids(group))
        return await super().pause(**kwargs)


def test_a_retried_step_that_must_collect_resumes_the_gateway_first(tmp_path: Path) -> None:
    """A redrawn group's agents can call the model only through an open gateway: here they finish only when
    they find it open. Kept paused, the retried step would wait for them until the guard's timeout."""
    gateway = PauseAnswerLostGroupLostGateway()
    harness = _harness(tmp_path, _settings(steps=2), gateway)
    waiting: list[str] = []
    finish_at_once = _agents(harness)

    def agents(group_ids: Sequence[str]) -> None:
        if not gateway.dropped:
            finish_at_once(group_ids)
        else:  # drawn after the loss: these agents need the model
            waiting.extend(group_ids)

    def agents_call_the_model() -> None:
        if not gateway.instance.pause.paused:
            while waiting:
                gateway.finish_group(waiting.pop())

    gateway.on_groups_created = agents
    gateway.on_long_poll = agents_call_the_model

    _run(harness)

    assert gateway.dropped
    assert gateway.lost == 1
    assert _pauses_and_resumes(gateway)[:4] == [
        ("resume", False, 0),
        ("pause", False, None),  # taken, its answer lost, a group lost with it
        ("resume", True, 0),  # the retry must collect the redrawn group: the gateway opens first
        ("pause", False, None),
    ]
    assert not set(gateway.dropped) & set(harness.trained_groups())
    assert [step for step, _ in harness.backend.updates] == [0, 1]


# -- prefetching --------------------------------------------------------------------------------------------


def test_rows_are_prefetched_and_no_events_are_read_while_paused(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=3))
    harness.gateway.on_groups_created = _agents(harness)

    _run(harness)

    reads = [call for call in harness.gateway.calls if call.method.startswith("rollout_events")]
    assert [call for call in reads if call.paused] == []
    assert {call.method for call in reads} == {"rollout_events_batch"}
    metrics = harness.metrics()
    assert [line["training/prefetch/rollouts_fetched_at_pause"] for line in metrics] == [0, 0, 0]
    prepared = sum(line["training/prefetch/rollouts_prepared_ahead"] for line in metrics)
    assert prepared >= 3 * TRAIN_BATCH * SAMPLES
    assert len(reads) >= -(-prepared // 3)  # at most 3 rollouts per request (events_batch_rollouts)
    assert len(harness.backend.trained_rollouts) == 3 * TRAIN_BATCH * SAMPLES
