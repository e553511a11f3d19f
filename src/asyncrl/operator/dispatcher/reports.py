"""Agent Job watch events become rollout transitions in the gateway.

The namespace's one label-selected Job watch delivers the run's agent Jobs here (the trainer Job's events go
straight to the reconciler, which never waits for the gateway). Each Job's rollout state is reported once per
state, `running` before an unseen success (`job_state.ReportBook`); a Job deleted before it finished fails its
rollout. An outcome is bound to the gateway instance its Job was launched through: the outcomes of Jobs
launched through a gateway that restarted since are ignored (their rollouts are gone with it).
"""

from __future__ import annotations

import asyncio

from asyncrl.operator.dispatcher.job_state import rollout_state_of_job
from asyncrl.operator.dispatcher.shared import (
    ANNOTATION_GATEWAY_INSTANCE,
    DispatchIO,
    DispatchState,
    job_annotations,
    say_once,
    transition,
)
from asyncrl.operator.kube import JSON
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names


class Reporter:
    def __init__(self, io: DispatchIO, state: DispatchState) -> None:
        self.io = io
        self.state = state
        self._job_events: asyncio.Queue[tuple[str, JSON]] = asyncio.Queue()

    def on_agent_job_event(self, event_type: str, job: JSON) -> None:
        """Called on the event loop by the namespace's Job watch, for this run's agent Jobs."""
        self._job_events.put_nowait((event_type, job))

    async def report_loop(self) -> None:
        await self.io.link.known.wait()  # which gateway instance a Job's outcome belongs to
        while True:
            event_type, job = await self._job_events.get()
            await self.report(event_type, job)

    async def report(self, event_type: str, job: JSON) -> None:
        """One watch event of an agent Job: track it as active or not, and report its rollout's state."""
        name = job["metadata"]["name"]
        annotations = job_annotations(job)
        rollout_id = annotations.get(names.ANNOTATION_ROLLOUT_ID)
        if rollout_id is None:
            return
        observed = rollout_state_of_job(job.get("status"))
        if event_type == "DELETED" and (observed is None or not observed[0].is_terminal):
            observed = (RolloutState.FAILED, "the agent Job was deleted before it finished")
        if observed is None:
            return
        state, message = observed
        self._track(name, active=not (state.is_terminal or event_type == "DELETED"))
        instance = annotations.get(ANNOTATION_GATEWAY_INSTANCE)
        if instance is not None and instance != self.io.link.instance:
            return  # launched through a gateway that restarted since: its rollout is gone with it
        if state is RolloutState.RUNNING or state is RolloutState.SUCCEEDED:
            self.state.agent_started = True
        elif state is RolloutState.FAILED and event_type != "DELETED":
            await say_once(
                self.io,
                self.state,
                ("AgentJobFailed", ""),
                reason="AgentJobFailed",
                message=f"agent Job {name} (rollout {rollout_id}) failed: {message}",
            )
        uid = job["metadata"].get("uid") or name
        for step in self.state.reported.to_report(uid, state):
            # Bound to the Job's gateway instance: a report still retrying while the gateway restarts must not
            # land on the new gateway's rollout of the same id (the gateway refuses it, 409).
            await transition(
                self.io, rollout_id, step, message if step is state else None, instance_id=instance
            )
        self.state.reported.record(uid, state)
        if event_type == "DELETED":
            self.state.reported.forget(uid)

    def _track(self, name: str, *, active: bool) -> None:
        """The Job is active, or no longer (a launch may go ahead); the reconciler counts them."""
        if active:
            self.state.active.add(name)
        elif name in self.state.active:
            self.state.active.discard(name)
            self.state.capacity.set()
        self.io.changed()
