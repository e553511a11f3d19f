"""Where a step's metrics go: one tracking layer writing JSON lines, Prometheus, W&B and TensorBoard.

Every step produces one flat dict keyed by metric name: verl's where verl has the quantity
(`critic/score/mean`, `actor/pg_loss`, ...), else asyncrl's (`training/async/*`, `timing/*`, ...);
`asyncrl.metric_names` holds them. The sinks only write it; what is measured is decided by the step loop.

W&B and TensorBoard go through verl's own `verl.utils.tracking.Tracking` (the trainer already depends on
verl; a verl user finds the same runs and names there). Two sinks stay ours, for reasons verl's backends
cannot meet: the JSON-lines file must survive a trainer-container restart (verl's `file` backend opens its
file with `"wb"`, erasing the steps already logged, and nests each record under `data`), and verl has no
Prometheus backend. A failing sink is logged and skipped: metrics never stop training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Gauge

from asyncrl.metric_names import prometheus_name

logger = logging.getLogger(__name__)


# Where metrics go when the command line names no place: beside the checkpoints (a PVC on a cluster when
# spec.trainer.checkpoint.claimName is set), so a cluster run's curves outlive its pod.
METRICS_SUBDIR = "metrics"
METRICS_FILE_NAME = "metrics.jsonl"
DEFAULT_WANDB_DIR = Path("wandb-runs")


@dataclass(frozen=True)
class MetricsPlaces:
    metrics_file: Path | None  # the JSON-lines file; None: not written
    wandb_dir: Path  # W&B's offline run, and TensorBoard's files under tensorboard/ unless told otherwise


def metrics_places(
    *, checkpoint_dir: Path | None, metrics_file: Path | None, wandb_dir: Path | None
) -> MetricsPlaces:
    """What was asked for, else under `<checkpoint_dir>/metrics/`, else no file and `./wandb-runs`."""
    if checkpoint_dir is None:
        return MetricsPlaces(metrics_file, wandb_dir or DEFAULT_WANDB_DIR)
    beside = checkpoint_dir / METRICS_SUBDIR
    return MetricsPlaces(metrics_file or beside / METRICS_FILE_NAME, wandb_dir or beside)


def spread(prefix: str, values: Sequence[float], *, separator: str = "_") -> dict[str, float]:
    """`{prefix}_min/_mean/_max` of `values` (nothing when there are none); `separator="/"` gives verl's
    `{prefix}/min`, ... names."""
    if not values:
        return {}
    return {
        f"{prefix}{separator}min": min(values),
        f"{prefix}{separator}mean": sum(values) / len(values),
        f"{prefix}{separator}max": max(values),
    }


class JsonLinesSink:
    """One JSON object per step, flushed at once (so a crash loses at most the step in progress)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{key: value for key, value in metrics.items() if math.isfinite(value)}}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def discard_from(self, step: int) -> int:
        """Drop the lines of `step` and later: a restarted trainer redoes those steps (their updates were
        lost), so the file keeps one line per step, in order. Returns the lines dropped."""
        self._file.close()
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                logged_step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                dropped += 1  # a line cut short by the crash
                continue
            if logged_step >= step:
                dropped += 1
            else:
                kept.append(line + "\n")
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text("".join(kept), encoding="utf-8")
        temporary.replace(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        return dropped

    def close(self) -> None:
        self._file.close()


class PrometheusSink:
    """The latest value of every metric as a gauge (`training/async/x` → `asyncrl_training_async_x`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        # Not a step metric: live state, so that "the gateway is paused and no trainer is updating" can be
        # told from "an update is running" (the gateway, in the same pod, exports asyncrl_gateway_paused).
        self.holding_pause = Gauge(
            "asyncrl_trainer_holding_pause",
            "1 from the trainer's pause of the gateway (for an update, a checkpoint load or save) until its "
            "resume is confirmed, else 0.",
            registry=self.registry,
        )

    @staticmethod
    def name_of(metric: str) -> str:
        return prometheus_name(metric)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for metric, value in {"trainer/step": float(step), **metrics}.items():
            gauge = self._gauges.get(metric)
            if gauge is None:
                gauge = Gauge(self.name_of(metric), f"asyncrl metric {metric}", registry=self.registry)
                self._gauges[metric] = gauge
            gauge.set(value)

    def close(self) -> None:
        pass


TrackingMode = Literal["online", "offline", "disabled"]


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block only: verl's Tracking reads its directories and modes there."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class VerlTrackingSink:
    """W&B (unless `wandb_mode` is disabled) and TensorBoard, through verl's `Tracking`.

    W&B `offline` writes under `wandb_directory` (sync it later with `wandb sync`); TensorBoard event files go
    to `tensorboard_directory` (`tensorboard --logdir DIR`).
    """

    def __init__(
        self,
        *,
        project: str,
        name: str,
        wandb_mode: TrackingMode,
        wandb_directory: Path,
        tensorboard_directory: Path,
        config: Mapping[str, Any],
    ) -> None:
        from verl.utils.tracking import Tracking

        backends = ["tensorboard"]
        if wandb_mode != "disabled":
            backends.append("wandb")
            wandb_directory.mkdir(parents=True, exist_ok=True)
        tensorboard_directory.mkdir(parents=True, exist_ok=True)
        self.backends = tuple(backends)
        self.tensorboard_directory = tensorboard_directory
        environment = {
            "WANDB_MODE": wandb_mode,
            "WANDB_DIR": str(wandb_directory),
            "TENSORBOARD_DIR": str(tensorboard_directory),
        }
        with _environment(environment):
            # verl reads config["trainer"] (its wandb proxy); the run's spec has that key, as a mapping.
            self._tracking = Tracking(
                project_name=project, experiment_name=name, default_backend=backends, config=dict(config)
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._tracking.log(data=dict(metrics), step=step)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._tracking.finish()


class MetricsSinks:
    def __init__(self, sinks: Sequence[JsonLinesSink | PrometheusSink | VerlTrackingSink]) -> None:
        self.sinks = list(sinks)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for sink in self.sinks:
            try:
                sink.log(step, metrics)
            except Exception as error:  # a metrics backend must never stop training
                logger.warning("metrics sink %s failed at step %d: %s", type(sink).__name__, step, error)

    def report_holding_pause(self, held: bool) -> None:
        """Whether the trainer holds the gateway paused now (the Prometheus sinks export it)."""
        for sink in self.sinks:
            if isinstance(sink, PrometheusSink):
                sink.holding_pause.set(1 if held else 0)

    def discard_from(self, step: int) -> None:
        """Forget logged steps from `step` on where a sink can (the JSON-lines file); see JsonLinesSink."""
        for sink in self.sinks:
            if isinstance(sink, JsonLinesSink):
                dropped = sink.discard_from(step)
                if dropped:
                    logger.info("dropped %d metrics lines of steps >= %d from %s", dropped, step, sink.path)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as error:
                logger.warning("closing metrics sink %s failed: %s", type(sink).__name__, error)
