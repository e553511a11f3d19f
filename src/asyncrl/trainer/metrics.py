"""Where a step's metrics go: a JSON-lines file, Prometheus, and Weights & Biases (offline unless keyed).

Every step produces one flat dict keyed by metric name (`training/async/*`, `timing/rollout_*`,
`training/update/*`, ...). The sinks only write it; what is measured is decided by the step loop.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Gauge

logger = logging.getLogger(__name__)


def spread(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """`{prefix}_min/_mean/_max` of `values` (nothing when there are none)."""
    if not values:
        return {}
    return {
        f"{prefix}_min": min(values),
        f"{prefix}_mean": sum(values) / len(values),
        f"{prefix}_max": max(values),
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

    @staticmethod
    def name_of(metric: str) -> str:
        return "asyncrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", metric)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for metric, value in {"trainer/step": float(step), **metrics}.items():
            gauge = self._gauges.get(metric)
            if gauge is None:
                gauge = Gauge(self.name_of(metric), f"asyncrl metric {metric}", registry=self.registry)
                self._gauges[metric] = gauge
            gauge.set(value)

    def close(self) -> None:
        pass


class WandbSink:
    """A W&B run; `offline` writes under `directory` (sync it later with `wandb sync`)."""

    def __init__(
        self,
        *,
        project: str,
        name: str,
        mode: Literal["online", "offline", "disabled"],
        directory: Path,
        config: Mapping[str, Any],
    ) -> None:
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project,
            name=name,
            mode=mode,
            dir=str(directory),
            config=dict(config),
            reinit="finish_previous",
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MetricsSinks:
    def __init__(self, sinks: Sequence[JsonLinesSink | PrometheusSink | WandbSink]) -> None:
        self.sinks = list(sinks)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for sink in self.sinks:
            try:
                sink.log(step, metrics)
            except Exception as error:  # a metrics backend must never stop training
                logger.warning("metrics sink %s failed at step %d: %s", type(sink).__name__, step, error)

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
