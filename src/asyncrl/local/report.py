"""What `asyncrl local run` tells its user: the status line of each step and the summary at the end.

Pure bookkeeping, fed by the supervisor with what the gateway reports (the trainer's window summaries and the
store's rollout totals). The totals live in the gateway's memory, so a restarted gateway starts again from
zero: they are kept per gateway instance and added up, and a restart loses none of them from the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.gateway_api.models import GatewayStats, WindowSummary
from asyncrl.rollouts import TERMINAL_STATES, RolloutState

COLUMNS = ("STEP", "ACTIVE", "CARRY-OVER", "MAX-AGE", "DRAIN", "REWARD", "FAILED", "RUNNING", "STEP-S")
# The order of outcomes in the summary; the names are the rollout states, as `kubectl get atr` counts them.
OUTCOMES = (RolloutState.SUCCEEDED, RolloutState.FAILED, RolloutState.TIMED_OUT, RolloutState.CANCELLED)


def header() -> str:
    return "  ".join(f"{column:>10}" for column in COLUMNS)


@dataclass(frozen=True)
class AgentCounts:
    """What the local agent runner saw: agents launched, and those it stopped before their rollout ended."""

    launched: int
    lost_with_gateway: int  # stopped because a restarted gateway no longer held their rollouts
    stopped_at_end: int  # still running when the run ended


@dataclass
class RunTally:
    """Steps, rewards and rollout outcomes seen so far in one local run."""

    first_step: int | None = None
    last_step: int | None = None  # the highest step trained (a redone step is not higher)
    first_reward: float | None = None
    last_reward: float | None = None
    updates: int = 0  # steps trained, a redone step counted again
    redone: list[int] = field(default_factory=list)  # steps trained again after a trainer restart
    _totals: dict[str, dict[str, int]] = field(default_factory=dict)  # gateway instance -> state -> count
    _line_at: float | None = None  # monotonic time of the last step line

    def record_stats(self, stats: GatewayStats) -> None:
        """The gateway's `/api/stats`: its instance and the rollouts that ended there, by state."""
        totals = stats.finished_totals
        self._totals[stats.instance_id] = {state.value: count for state, count in totals.items()}

    def record_step(self, summary: WindowSummary) -> bool:
        """One update the trainer reported; whether it trained a step again (one at or below the highest so
        far)."""
        reward = summary.reward_mean
        self.updates += 1
        if self.first_step is None:
            self.first_step, self.first_reward = summary.step, reward
        if self.last_step is not None and summary.step <= self.last_step:
            self.redone.append(summary.step)
            if summary.step == self.last_step:
                self.last_reward = reward
            return True
        self.last_step, self.last_reward = summary.step, reward
        return False

    def step_lines(self, summary: WindowSummary, *, running_agents: int, now: float) -> list[str]:
        """What a reported update prints: its status line, and for the first update of a restarted trainer a
        note saying whether it trains a step again and the real time since the line before (the trainer times
        only the step it ran, from its own start: 2.9 s where 12.3 s had passed). `now`: a monotonic time."""
        since = None if self._line_at is None else now - self._line_at
        self._line_at = now
        redo = self.record_step(summary)
        lines = [self.status_line(summary, running_agents=running_agents, redo=redo)]
        if since is not None and summary.steps_in_process == 1:  # a restarted trainer's first update
            what = (
                f"step {summary.step} trained again: the trainer restarted from its last checkpoint, and its "
                "update of this step was lost"
                if redo
                else f"step {summary.step} is the first after the trainer restarted"
            )
            lines.append(f"  ({what}; {since:.1f} s since the line before)")
        return lines

    def count(self, state: RolloutState) -> int:
        """Rollouts that ended in `state` in this run, over every gateway instance."""
        return sum(totals.get(state.value, 0) for totals in self._totals.values())

    @property
    def failed(self) -> int:
        return self.count(RolloutState.FAILED)

    def status_line(self, summary: WindowSummary, *, running_agents: int, redo: bool = False) -> str:
        values = (
            f"{summary.step} redo" if redo else summary.step,
            summary.active_groups,
            summary.new_carry_over_rollouts or 0,
            summary.carry_over_age_max_steps or 0,
            f"{summary.proxy_drain_seconds or 0.0:.3f}",
            f"{summary.reward_mean or 0.0:.3f}",
            self.failed,
            running_agents,
            f"{summary.step_seconds or 0.0:.1f}",
        )
        return "  ".join(f"{value!s:>10}" for value in values)

    def rollouts_line(self, agents: AgentCounts | None) -> str:
        """Every launched agent's rollout in exactly one place: an outcome the gateway counted, stopped with
        a gateway that restarted (it lost their rollouts), stopped when the run ended, or ended in a gateway
        instance killed before it reported them. Without `agents` (none launched), the gateway's outcomes."""
        ended = {state: self.count(state) for state in OUTCOMES}
        assert set(OUTCOMES) == TERMINAL_STATES
        by_outcome = ", ".join(f"{count} {state.value.replace('_', ' ')}" for state, count in ended.items())
        total = sum(ended.values())
        if agents is None or agents.launched == 0:
            return f"  rollouts: {total} ended: {by_outcome}"
        parts = [by_outcome]
        restarts = len(self._totals) - 1
        if agents.lost_with_gateway:
            parts.append(f"{agents.lost_with_gateway} stopped when the gateway restarted and lost them")
        if agents.stopped_at_end:
            parts.append(f"{agents.stopped_at_end} stopped when the run ended")
        rest = agents.launched - total - agents.lost_with_gateway - agents.stopped_at_end
        if rest > 0:
            plural = "s" if restarts != 1 else ""
            where = (
                f"ended in a gateway killed before it reported them ({restarts} restart{plural})"
                if restarts
                else "not accounted for (please report this)"
            )
            parts.append(f"{rest} {where}")
        elif rest < 0:
            parts.append(f"{-rest} of them without an agent (cancelled or timed out before one started)")
        return f"  rollouts: {agents.launched} launched: " + "; ".join(parts)

    def summary(
        self, *, outcome: str, work_dir: Path, metrics_file: Path | None, agents: AgentCounts | None = None
    ) -> list[str]:
        """The lines printed when the run ends, whatever ended it."""
        lines = [f"run {outcome}"]
        if self.first_step is None or self.last_step is None:
            lines.append("  steps:    none trained")
        else:
            n_steps = self.last_step - self.first_step + 1
            steps = f"  steps:    {n_steps} (step {self.first_step} to {self.last_step})"
            if self.redone:
                again = ", ".join(str(step) for step in self.redone)
                plural = "s" if len(self.redone) > 1 else ""
                steps += (
                    f"; {self.updates} updates: step{plural} {again} trained again after a trainer restart "
                    "(the updates since its last checkpoint were lost)"
                )
            lines.append(steps)
        lines.append(self.rollouts_line(agents))
        if self.first_reward is not None and self.last_reward is not None:
            lines.append(
                f"  reward:   {self.first_reward:.3f} (step {self.first_step}) -> "
                f"{self.last_reward:.3f} (step {self.last_step})"
            )
        lines.append(f"  logs:     {work_dir}/ (trainer.log, gateway.log, agents/)")
        if metrics_file is not None:
            lines.append(f"  metrics:  {metrics_file}")
        return lines
