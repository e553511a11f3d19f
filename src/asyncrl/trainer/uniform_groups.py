"""Dynamic sampling (DAPO's "filter groups"): which complete groups carry no signal for GRPO.

GRPO's advantage of a row is its reward minus its group's mean reward (divided by the group's std). In a
group whose rows all scored alike every advantage is 0: the update learns nothing from it, yet its tokens
still count in the loss's token mean and dilute what the other groups teach. With
`rollout.dropUniformGroups` the trainer drops such groups before the update and waits for others in their
place (asyncrl.trainer.loop). A group with a single row is not uniform: GRPO then uses its reward itself as
the advantage (verl's singleton rule).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from asyncrl.trainer.rows import TrainingRow
from asyncrl.trainer.window import Group

REWARD_TOLERANCE = 1e-9  # rewards this close are alike (a float reward read back from JSON is exact)


def uniform_groups(groups: Sequence[Group], rows: Sequence[TrainingRow]) -> list[Group]:
    """The groups, in the order given, whose two or more rows all have the same reward."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        rewards[row.group_id].append(row.reward)
    return [
        group
        for group in groups
        if len(scores := rewards.get(group.group_id, ())) >= 2
        and max(scores) - min(scores) <= REWARD_TOLERANCE
    ]


def drop_limit(*, enabled: bool, train_batch_size: int) -> int:
    """Uniform groups one update may drop: trainBatchSize, so a run whose every group scores alike (a policy
    that solved the task, or one that never scores) still updates, after at most twice the usual
    collection."""
    return train_batch_size if enabled else 0
