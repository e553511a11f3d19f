"""What `asyncrl runs summary` prints: a run's state and last step, from objects already read (pure).

The status is shown by its CRD field names (what `kubectl get atr -o yaml` shows), read from the object as
stored rather than through the status model: a CLI older or newer than the operator still shows every field.
The trainer's metrics are its Prometheus gauges (`asyncrl_` + the per-step metric name), the latest step's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from asyncrl import metric_names as names
from asyncrl.metric_names import prometheus_name

# Shown on their own lines; every other scalar status field goes under "last step".
_HEADLINE_FIELDS = (
    "phase",
    "message",
    "step",
    "lastStepTime",
    "startTime",
    "observedGeneration",
    "rayCluster",
)
# The trainer gauges worth a glance (docs/metrics.md names each); the rest stay on its /metrics.
TRAINER_GAUGES = (
    "asyncrl_trainer_step",
    *(
        prometheus_name(metric)
        for metric in (
            names.SCORE_MEAN,
            names.STEP_SECONDS,
            names.UPDATE_PHASE_SECONDS,
            names.COMPLETED_ROLLOUTS,
            names.FAILED_ROLLOUTS_CONSUMED,
            names.CARRY_OVER_ROLLOUTS,
            names.CARRY_OVER_AGE_MAX,
            names.DRAIN_SECONDS,
            names.ACTOR_PG_LOSS,
        )
    ),
    "asyncrl_trainer_holding_pause",
)
# A trainer from before the rename to verl's names exports the old gauge names: shown under the new ones.
_GAUGE_ALIASES = {prometheus_name(old): prometheus_name(new) for old, new in names.READ_ALIASES.items()}


@dataclass(frozen=True)
class EventLine:
    """One Kubernetes event about the run."""

    time: datetime | None
    type: str
    reason: str
    message: str
    count: int = 1


@dataclass(frozen=True)
class TrainerMetrics:
    """The trainer's gauges by Prometheus name, or why they could not be read."""

    gauges: Mapping[str, float]
    source: str
    unavailable: str | None = None


@dataclass(frozen=True)
class OperatorWatch:
    """An installed operator (its Deployment) and the namespaces it watches (None: all of them)."""

    namespace: str
    name: str
    watches: tuple[str, ...] | None


def operator_lines(
    run_namespace: str, operators: Sequence[OperatorWatch] | None, unknown: str = ""
) -> list[str]:
    """For a run without a status: which installed operator would serve it, or why none does. `operators`
    None: the Deployments could not be listed (`unknown` says why)."""
    label = "operator:       "
    if operators is None:
        return [f"{label}not looked up ({unknown}); is one installed, and does it watch {run_namespace}?"]
    if not operators:
        return [
            f"{label}no asyncrl operator Deployment found (label app.kubernetes.io/name=asyncrl-operator): "
            "install the chart (docs/install.md)"
        ]
    serving = [op for op in operators if op.watches is None or run_namespace in op.watches]
    if serving:
        op = serving[0]
        return [
            f"{label}{op.namespace}/{op.name} watches {run_namespace} but has not written a status: is it "
            f"running? (`kubectl get pods -n {op.namespace}`, `kubectl logs -n {op.namespace} "
            f"deploy/{op.name}`)"
        ]
    return [
        f"{label}{op.namespace}/{op.name} watches only {', '.join(op.watches or ())}, not {run_namespace}: "
        f"add {run_namespace} to the chart's watch.namespaces (or set watch.clusterWide=true) and upgrade "
        "the release"
        for op in operators
    ]


def parse_gauges(exposition: str) -> dict[str, float]:
    """Every unlabelled sample of a Prometheus text exposition, by name; an older trainer's gauge also under
    its current name (`asyncrl_training_reward_mean` as `asyncrl_critic_score_mean`)."""
    gauges = {
        sample.name: float(sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if not sample.labels
    }
    for old, new in _GAUGE_ALIASES.items():
        if old in gauges and new not in gauges:
            gauges[new] = gauges[old]
    return gauges


def _ago(moment: str, now: datetime) -> str:
    try:
        then = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    except ValueError:
        return moment
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{moment} ({seconds}s ago)"
    if seconds < 7200:
        return f"{moment} ({seconds // 60}m ago)"
    return f"{moment} ({seconds // 3600}h ago)"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _counts(counts: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={_value(value)}" for key, value in counts.items())


def _steps_text(step: Any, total: Any) -> str:
    """Updates done, as STEPS counts them (from 1), and the last one's step number as logs count it (from 0):
    `status.step` 15 is the 16th update, so "16/16 done" beside "step 15" must not read as one short."""
    of_total = f" of spec.totalSteps {total}" if total is not None else " (open-ended: no spec.totalSteps)"
    if step is None:
        return f"none done yet{of_total}"
    done = f"{int(step) + 1}/{total}" if total is not None else str(int(step) + 1)
    return f"{done} done; the last was step {step} (status.step, counted from 0 as in the trainer's log)"


def summary_lines(
    run: Mapping[str, Any],
    *,
    events: Sequence[EventLine],
    trainer: TrainerMetrics | None,
    now: datetime,
    operators: list[str] | None = None,
) -> list[str]:
    """The summary of `run` (an AsyncTrainingRun object as the API returns it); `operators`: the lines of
    `operator_lines`, for a run without a status."""
    metadata, spec = run.get("metadata") or {}, run.get("spec") or {}
    status: Mapping[str, Any] = run.get("status") or {}
    lines = [f"run:            {metadata.get('namespace')}/{metadata.get('name')}"]
    lines.append(
        f"phase:          {status.get('phase') or '(none yet: the operator has not written a status)'}"
    )
    if not status.get("phase"):
        lines.extend(operators or [])
    if status.get("message"):
        lines.append(f"message:        {status['message']}")
    lines.append(f"steps:          {_steps_text(status.get('step'), spec.get('totalSteps'))}")
    for key, label in (("lastStepTime", "last step at"), ("startTime", "trainer start")):
        if status.get(key):
            lines.append(f"{label + ':':<15} {_ago(str(status[key]), now)}")
    if status.get("rayCluster"):
        lines.append(f"ray cluster:    {status['rayCluster']}")
    last_step = {
        key: value
        for key, value in status.items()
        if key not in _HEADLINE_FIELDS
        and isinstance(value, int | float | str)
        and not isinstance(value, bool)
    }
    if last_step:
        lines.append("last step:")
        lines += [f"  {key}: {_value(value)}" for key, value in sorted(last_step.items())]
    for key in sorted(status):
        value = status[key]
        if isinstance(value, Mapping) and value:
            lines.append(f"{key + ':':<15} {_counts(value)}")
    conditions = status.get("conditions") or []
    if conditions:
        lines.append("conditions:")
        for condition in conditions:
            message = f": {condition['message']}" if condition.get("message") else ""
            lines.append(
                f"  {condition.get('type')}={condition.get('status')} ({condition.get('reason')}){message}"
            )
    if events:
        lines.append(f"events (latest {len(events)}):")
        for event in events:
            when = event.time.isoformat() if event.time else "-"
            repeated = f" (x{event.count})" if event.count > 1 else ""
            lines.append(f"  {when} {event.type} {event.reason}{repeated}: {event.message}")
    if trainer is not None:
        if trainer.unavailable is not None:
            lines.append(f"trainer metrics ({trainer.source}): not reachable: {trainer.unavailable}")
        else:
            lines.append(f"trainer metrics ({trainer.source}):")
            shown = [name for name in TRAINER_GAUGES if name in trainer.gauges]
            for name in shown:
                value = trainer.gauges[name]
                lines.append(f"  {name}: {_value(value) if math.isfinite(value) else value}")
            if not shown:
                lines.append("  (no step logged yet)")
    return lines
