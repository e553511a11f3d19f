"""Prometheus metrics of one gateway (its own registry, so several gateways can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from asyncrl.rollouts import RolloutState


class _RolloutStateCollector(Collector):
    def __init__(self, counts: Callable[[], dict[RolloutState, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "asyncrl_gateway_rollouts", "Rollouts in the store by state.", labels=["state"]
        )
        for state, count in self._counts().items():
            family.add_metric([state.value], count)
        yield family


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "asyncrl_gateway_requests",
            "Requests by route and status code.",
            ["route", "code"],
            registry=self.registry,
        )
        self.proxy_latency = Histogram(
            "asyncrl_gateway_proxy_latency_seconds",
            "Latency of proxied model calls, upstream included.",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.inflight = Gauge("asyncrl_gateway_inflight", "Model calls in flight.", registry=self.registry)
        self.paused = Gauge(
            "asyncrl_gateway_paused", "1 while the gateway is paused.", registry=self.registry
        )
        self.pause_lease_expirations = Counter(
            "asyncrl_gateway_pause_lease_expirations",
            "Pauses that ended because their lease ran out unrenewed (the trainer died or was cut off).",
            registry=self.registry,
        )
        self.rejected_paused = Counter(
            "asyncrl_gateway_paused_rejections",
            "Model calls answered 429 while paused.",
            registry=self.registry,
        )
        self.rejections = Counter(
            "asyncrl_gateway_rejections",
            "Requests refused at admission or for breaking a rule of the store, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.sampling_overridden = Counter(
            "asyncrl_gateway_sampling_overridden",
            "Train-mode model calls whose sampling parameters the gateway replaced with the run's or removed "
            "(spec.gateway.samplingParams Enforce).",
            registry=self.registry,
        )
        self.held = Gauge(
            "asyncrl_gateway_held_calls_now", "Model calls held now (Hold mode).", registry=self.registry
        )
        self.held_total = Counter(
            "asyncrl_gateway_held_calls",
            "Model calls held while paused or before any upstream (Hold mode); a re-issue counts again.",
            registry=self.registry,
        )
        self.hold_wait = Histogram(
            "asyncrl_gateway_hold_wait_seconds",
            "How long held model calls waited before they were forwarded (or refused).",
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.hold_refusals = Counter(
            "asyncrl_gateway_hold_refusals",
            "Held model calls answered 429 (or 503): hold_timeout, hold_full (the cap was reached), "
            "or shutdown (the gateway was stopping).",
            ["reason"],
            registry=self.registry,
        )
        self.aborted = Counter(
            "asyncrl_gateway_aborted_calls",
            "Model calls in flight cancelled upstream by a pause with abort (drain policy Abort).",
            registry=self.registry,
        )
        self.streamed_calls = Counter(
            "asyncrl_gateway_streamed_calls",
            "Streamed model calls (stream: true) by how they ended: completed, abandoned by the agent "
            "(cancelled upstream, captured as aborted), failed (the upstream's stream broke).",
            ["outcome"],
            registry=self.registry,
        )
        self.stream_first_chunk = Histogram(
            "asyncrl_gateway_stream_first_chunk_seconds",
            "Time from forwarding a streamed call to its first upstream chunk (held time excluded).",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.capture_limit_hits = Counter(
            "asyncrl_gateway_capture_limit_hits",
            "Model calls that met a capture limit (limit: rollout or store): refused before forwarding "
            "(outcome refused: 413 or 507), or answered but kept without their tokens because the limit was "
            "reached while they were in flight (outcome not_captured).",
            ["limit", "outcome"],
            registry=self.registry,
        )
        self.capture_bytes = Gauge(
            "asyncrl_gateway_capture_bytes",
            "Bytes the store's captured model calls hold now (what --max-capture-bytes bounds).",
            registry=self.registry,
        )
        self.upstream_registrations = Counter(
            "asyncrl_gateway_upstream_registrations",
            "Registrations of the model servers (PUT /api/upstreams). A trainer registers them each time it "
            "starts, so under one gateway a rising count is its trainer restarting.",
            registry=self.registry,
        )
        self.connections_closed = Counter(
            "asyncrl_gateway_connections_closed",
            "Connections the gateway closed itself (connections.py), by reason: header_timeout, "
            "header_too_large, idle, room (closed for a new connection at --max-connections), full (the new "
            "connection itself: every open one was in a request or held the key).",
            ["reason"],
            registry=self.registry,
        )
        self.parsed_body_bytes = Counter(
            "asyncrl_gateway_parsed_body_bytes",
            "Request body bytes parsed as JSON (each body once; a body too large is refused unparsed).",
            registry=self.registry,
        )
        self.drain_seconds = Gauge(
            "asyncrl_gateway_last_drain_seconds",
            "Duration of the last pause's drain.",
            registry=self.registry,
        )

    def watch_capture(self, capture_bytes: Callable[[], float]) -> None:
        self.capture_bytes.set_function(capture_bytes)

    def watch_rollouts(self, counts: Callable[[], dict[RolloutState, int]]) -> None:
        self.registry.register(_RolloutStateCollector(counts))
