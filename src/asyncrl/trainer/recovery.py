"""How the trainer's window is rebuilt from the gateway after a restart of the trainer or of the gateway.

Two things can restart under a run. The trainer container: the gateway still holds the window's rollouts, but
the weights go back to the last checkpoint, so steps after it are redone and groups drawn by those lost steps
count as drawn at the checkpoint's step (`groups_of`). The gateway (a sidecar restart, or local mode
restarting it): its rollouts, events and feed are gone, so every group whose rollouts it no longer holds is
redrawn as a new group from the same prompt, and whatever it holds that no group owns is cleaned up
(`plan_resync`). Both are plain functions of what the gateway lists, so they are tested without I/O.

A checkpoint also fits only the world size it was saved with (the verl backend's files are FSDP shards, one
per rank): `resume_decision` refuses a resume after `spec.trainer.gpus` or `nodes` changed, rather than
resharding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.api.types import TrainerBackend
from asyncrl.gateway_api.models import RolloutView
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.window import Group


def groups_of(rollouts: Sequence[RolloutView], *, resume_step: int) -> list[Group]:
    """The gateway's rollouts as window groups, for a trainer resuming at `resume_step`.

    A group enqueued after `resume_step` was drawn by a step whose update was lost with the trainer; it is
    kept (its rollouts are valid samples) as if drawn at `resume_step`, so its age counts from there.
    """
    members: dict[str, list[RolloutView]] = defaultdict(list)
    for rollout in rollouts:
        members[rollout.group_id].append(rollout)
    groups = []
    for group_id, views in members.items():
        views.sort(key=lambda view: view.rollout_id)
        groups.append(
            Group(
                group_id=group_id,
                enqueued_step=min(min(view.step for view in views), resume_step),
                rollout_ids=tuple(view.rollout_id for view in views),
                terminal_states={view.rollout_id: view.state for view in views if view.state.is_terminal},
            )
        )
    groups.sort(key=lambda group: (group.enqueued_step, group.group_id))
    return groups


@dataclass(frozen=True, kw_only=True)
class ResyncPlan:
    """What to do so that the window and the gateway agree again."""

    lost_groups: tuple[str, ...]  # window groups with a rollout the gateway lacks: drop, then redraw
    terminal_states: dict[str, RolloutState]  # rollout id -> state, for rollouts of the groups kept
    to_cancel: tuple[str, ...]  # unfinished rollouts that no kept group owns
    to_delete: tuple[str, ...]  # every rollout that no kept group owns (the cancelled ones too)


def plan_resync(groups: Sequence[Group], rollouts: Sequence[RolloutView]) -> ResyncPlan:
    """Compare the window's groups with the gateway's listing.

    A group is kept only when the gateway holds every one of its rollouts: group integrity is what GRPO
    needs, so a group with a member lost is redrawn whole. Rollouts that belong to no kept group (siblings
    of a lost group, a batch created just before a failure, consumed groups not yet deleted) are cancelled
    when unfinished and deleted, so no agent works for a group that will never be trained.
    """
    held = {rollout.rollout_id: rollout for rollout in rollouts}
    lost = tuple(
        group.group_id for group in groups if any(rollout_id not in held for rollout_id in group.rollout_ids)
    )
    lost_ids = set(lost)
    kept_rollouts = {
        rollout_id for group in groups if group.group_id not in lost_ids for rollout_id in group.rollout_ids
    }
    terminal = {
        rollout_id: held[rollout_id].state
        for rollout_id in sorted(kept_rollouts)
        if held[rollout_id].state.is_terminal
    }
    strays = sorted(rollout_id for rollout_id in held if rollout_id not in kept_rollouts)
    return ResyncPlan(
        lost_groups=lost,
        terminal_states=terminal,
        to_cancel=tuple(rollout_id for rollout_id in strays if not held[rollout_id].state.is_terminal),
        to_delete=tuple(strays),
    )


def sharded_world_size(spec: AsyncTrainingRunSpec) -> int | None:
    """The world size a run's checkpoints depend on: nodes x GPUs per node for verl; None for the Reference
    backend, whose one-process files do not depend on it."""
    if spec.trainer.backend is not TrainerBackend.VERL:
        return None
    return spec.trainer.nodes * spec.trainer.node_gpus


@dataclass(frozen=True, kw_only=True)
class ResumeDecision:
    """Whether a checkpoint may be resumed by this run, and why (for a log line or a refusal)."""

    refused: bool
    detail: str
    fix: str = ""


def resume_decision(
    *, checkpoint: str, saved_world_size: int | None, world_size: int | None
) -> ResumeDecision:
    """A checkpoint saved with `saved_world_size` GPUs, resumed by a run of `world_size`: the same, or either
    unknown (a checkpoint saved before asyncrl recorded it, the Reference backend), resumes."""
    if world_size is None:
        return ResumeDecision(refused=False, detail=f"{checkpoint}: its files do not depend on the GPUs")
    if saved_world_size is None:
        return ResumeDecision(
            refused=False,
            detail=(
                f"{checkpoint} does not record the GPUs it was saved with (an older checkpoint): resumed as "
                f"if saved with this run's {world_size}; if that is wrong, verl fails to load its shards"
            ),
        )
    if saved_world_size == world_size:
        return ResumeDecision(
            refused=False, detail=f"{checkpoint} was saved with {world_size} GPU(s), as now"
        )
    return ResumeDecision(
        refused=True,
        detail=(
            f"{checkpoint} was saved with {saved_world_size} GPU(s) (nodes x GPUs per node; FSDP writes one "
            f"shard per GPU) and this run has {world_size}: verl cannot load it"
        ),
        fix=(
            f"set spec.trainer.gpus (or nodes and gpusPerNode) back to {saved_world_size} GPU(s) in all, or "
            "start from a fresh checkpoint directory (a new spec.trainer.checkpoint.claimName, or remove the "
            "step-* checkpoints)"
        ),
    )
