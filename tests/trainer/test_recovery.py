"""The pure rules of recovery: what a restarted gateway lost, and where a restarted trainer resumes."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.gateway_api.models import RolloutView
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.metrics import JsonLinesSink
from asyncrl.trainer.recovery import groups_of, plan_resync
from asyncrl.trainer.window import Group


def _view(
    rollout_id: str, group_id: str, *, step: int = 0, state: RolloutState = RolloutState.QUEUED
) -> RolloutView:
    return RolloutView(
        rollout_id=rollout_id,
        group_id=group_id,
        step=step,
        input={"q": group_id},
        mode="train",
        state=state,
        attempt_id=None,
        timeout_seconds=None,
        created_at=0.0,
        started_at=None,
        finished_at=None,
        reward=None,
        message=None,
        n_model_calls=0,
    )


def _group(group_id: str, *members: str) -> Group:
    return Group(group_id=group_id, enqueued_step=0, rollout_ids=members)


def test_an_empty_restarted_gateway_loses_every_group() -> None:
    plan = plan_resync([_group("a", "a0", "a1"), _group("b", "b0", "b1")], [])
    assert plan.lost_groups == ("a", "b")
    assert plan.to_cancel == plan.to_delete == ()


def test_a_group_with_one_member_missing_is_redrawn_whole_and_its_siblings_cleaned_up() -> None:
    held = [_view("a0", "a"), _view("b0", "b", state=RolloutState.SUCCEEDED), _view("b1", "b")]
    plan = plan_resync([_group("a", "a0", "a1"), _group("b", "b0", "b1")], held)
    assert plan.lost_groups == ("a",)
    assert plan.to_cancel == ("a0",)
    assert plan.to_delete == ("a0",)
    assert plan.terminal_states == {"b0": RolloutState.SUCCEEDED}


def test_rollouts_no_group_owns_are_cancelled_if_unfinished_and_deleted() -> None:
    held = [_view("x0", "x", state=RolloutState.SUCCEEDED), _view("y0", "y", state=RolloutState.RUNNING)]
    plan = plan_resync([], held)
    assert plan.to_cancel == ("y0",)
    assert plan.to_delete == ("x0", "y0")


def test_groups_drawn_by_lost_steps_count_as_drawn_at_the_resumed_step() -> None:
    views = [_view("a0", "a", step=1), _view("b0", "b", step=5), _view("b1", "b", step=5)]
    groups = {group.group_id: group for group in groups_of(views, resume_step=3)}
    assert groups["a"].enqueued_step == 1
    assert groups["b"].enqueued_step == 3
    assert groups["b"].rollout_ids == ("b0", "b1")


def test_the_metrics_file_forgets_redone_steps_and_a_line_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step, "x": 1.0}) for step in range(5)]
    path.write_text("\n".join(lines) + '\n{"step": 5, "x"')
    sink = JsonLinesSink(path)
    assert sink.discard_from(3) == 3
    sink.log(3, {"x": 2.0})
    sink.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
