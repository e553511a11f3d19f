"""The Lease's I/O: wait until this replica leads, keep renewing, exit on a loss, release on a stop.

The decisions are `leadership.decide`'s; this module reads and writes the Lease with the operator's client.
The election runs in a thread of its own, not on the event loop: at 100 runs on 2 cores the loop, busy
starting the runs, woke the renewal too late and both replicas gave up their Lease in turn (measured with
`benchmarks/many_runs.py --failover`). The thread renews every `retry_seconds`, bounds each request by the
time left before the renew deadline, and checks the deadline itself, whatever the loop is doing. It has a
client of its own (`election_client`): its own kept-alive connection, not one of the pool the runs' calls
fill, and no urllib3 retries, which had stretched one timed-out renewal to 14 s. A write
carries the resourceVersion read: a 409 means another replica wrote first, and the next read says who holds
the Lease.

A lost lease ends the process (`os._exit`, after an ERROR line): no handler, cleanup or queued request of the
former leader may write once another replica could lead, and a restart (the Deployment's) starts it again as
a candidate. `handlers._startup` awaits `lead()` before starting any watch, so a candidate does nothing but
serve its probes and review its permissions.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from asyncrl.operator.health import Readiness
from asyncrl.operator.kube import count_requests
from asyncrl.operator.leadership import (
    Decision,
    LeaderElectionConfig,
    LeaseRecord,
    NoLease,
    Sighting,
    Verdict,
    decide,
    lease_spec,
    released_spec,
    sighted,
    wait_seconds,
)
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.permissions import Missing, Permission

logger = logging.getLogger(__name__)

LOST_EXIT_CODE = 1
LEASE_PERMISSIONS = tuple(
    Permission(verb, "coordination.k8s.io", "leases") for verb in ("get", "create", "update")
)


def default_identity(environ: dict[str, str] | None = None) -> str:
    """The pod's name (env POD_NAME, from the downward API): a restarted container takes its own Lease back at
    once. Elsewhere hostname-pid-random, unique per process."""
    environ = dict(os.environ) if environ is None else environ
    return environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def election_client(api_client: Any, metrics: OperatorMetrics) -> Any:
    """A client like the operator's (same server and identity) for the Lease alone: no retries (the
    election's loop is the retry), its requests counted in `asyncrl_operator_api_requests_total` too."""
    from kubernetes import client

    configuration = copy.deepcopy(api_client.configuration)
    configuration.retries = False
    own = client.ApiClient(configuration)
    count_requests(own, lambda verb, resource: metrics.api_requests.labels(verb, resource).inc())
    return own


def required_permissions(config: LeaderElectionConfig | None) -> list[Missing]:
    """The Lease permissions the permissions review checks too (none without election)."""
    if config is None:
        return []
    return [Missing(config.namespace, permission) for permission in LEASE_PERMISSIONS]


def exit_process(reason: str) -> None:
    """The loss's end: flush the log, then exit at once, without cleanup (which would write)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stderr.flush()
    os._exit(LOST_EXIT_CODE)


class LeaderElector:
    """One candidate: `acquire()` returns once it leads; its thread renews until `release()` or a loss."""

    def __init__(
        self,
        api_client: Any,
        config: LeaderElectionConfig,
        *,
        on_change: Callable[[bool], None] = lambda leading: None,
        on_lost: Callable[[str], None] = exit_process,
    ) -> None:
        from kubernetes import client

        self.config = config
        self._coordination: Any = client.CoordinationV1Api(api_client)
        self._on_change = on_change
        self._on_lost = on_lost
        self._sighting: Sighting | None = None
        self._renewed_at: float | None = None  # monotonic time the last successful write was sent
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting_reason = ""

    @property
    def leading(self) -> bool:
        return self._renewed_at is not None

    async def acquire(self) -> None:
        """Return once this replica leads (a cancellation stops the candidate)."""
        loop = asyncio.get_running_loop()
        led: asyncio.Future[None] = loop.create_future()

        def lead_now() -> None:
            if not led.done():
                led.set_result(None)

        self._thread = threading.Thread(
            target=self._run, args=(lambda: loop.call_soon_threadsafe(lead_now),), name="leader-election"
        )
        self._thread.daemon = True
        self._thread.start()
        try:
            await led
        except asyncio.CancelledError:
            self._stopping.set()
            raise

    async def release(self) -> None:
        """A graceful stop: stop renewing and clear the holder, so a candidate takes over at its next look."""
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.config.renew_deadline_seconds)

    # -- the thread ---------------------------------------------------------------------------------------

    def _run(self, led: Callable[[], None]) -> None:
        started = time.monotonic()
        logger.info("leader election: candidate %s for Lease %s", self.config.identity, self.config.lease)
        while not self._stopping.is_set():
            lease, decision = self._look()
            if self.leading:
                break
            if decision.verdict is Verdict.ACQUIRE:  # its write failed: another replica wrote first (409)
                logger.info(
                    "leader election: could not take Lease %s (%s)", self.config.lease, decision.reason
                )
            elif decision.reason != self._waiting_reason:
                logger.info("leader election: standing by: %s", decision.reason)
                self._waiting_reason = decision.reason
            self._stopping.wait(
                wait_seconds(lease=lease, leading=False, now=time.monotonic(), config=self.config)
            )
        else:
            return  # stopped while standing by: nothing held
        logger.info(
            "leader election: %s leads now (Lease %s, after %.1f s; %s)",
            self.config.identity,
            self.config.lease,
            time.monotonic() - started,
            decision.reason,
        )
        self._on_change(True)
        led()
        self._renew_until_stopped()

    def _renew_until_stopped(self) -> None:
        next_look = time.monotonic() + self.config.retry_seconds
        while True:
            assert self._renewed_at is not None
            deadline = self._renewed_at + self.config.renew_deadline_seconds
            # Wake at the next renewal, or at the deadline when renewals have been failing until then.
            if self._stopping.wait(max(0.0, min(next_look, deadline) - time.monotonic())):
                self._release()
                return
            next_look = time.monotonic() + self.config.retry_seconds
            _, decision = self._look()
            if decision.verdict is Verdict.LOST:
                self._lose(decision.reason)
                return

    def _lose(self, reason: str) -> None:
        self._renewed_at = None
        self._on_change(False)
        logger.error(
            "leader election: lost Lease %s: %s; exiting (code %d) so that this replica writes nothing more",
            self.config.lease,
            reason,
            LOST_EXIT_CODE,
        )
        self._on_lost(reason)

    def _release(self) -> None:
        self._renewed_at = None
        self._on_change(False)
        lease = self._read(timeout=self.config.retry_seconds)
        if isinstance(lease, Sighting) and lease.record.holder == self.config.identity:
            spec = released_spec(previous=lease.record, now=datetime.now(UTC))
            if self._write(lease.record, spec, timeout=self.config.retry_seconds):
                logger.info("leader election: released Lease %s", self.config.lease)
                return
        logger.warning("leader election: could not release Lease %s; it expires by itself", self.config.lease)

    def _look(self) -> tuple[Sighting | NoLease, Decision]:
        """Read the Lease, decide, write what the decision says; `_renewed_at` follows a successful write.
        A holder's requests may take no longer than the time left before its renew deadline."""

        def time_left() -> float:
            if self._renewed_at is None:
                return self.config.renew_deadline_seconds
            return self._renewed_at + self.config.renew_deadline_seconds - time.monotonic()

        lease = self._read(timeout=time_left()) if time_left() > 0 else NoLease.UNREADABLE
        decision = decide(
            lease=lease,
            identity=self.config.identity,
            renewed_at=self._renewed_at,
            now=time.monotonic(),
            config=self.config,
        )
        if decision.verdict in (Verdict.ACQUIRE, Verdict.RENEW) and time_left() > 0:
            previous = lease.record if isinstance(lease, Sighting) else None
            spec = lease_spec(
                previous=previous, identity=self.config.identity, now=datetime.now(UTC), config=self.config
            )
            sent = time.monotonic()
            if self._write(previous, spec, timeout=time_left()):
                self._renewed_at = sent
        return lease, decision

    def _read(self, *, timeout: float) -> Sighting | NoLease:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self._call(
                self._coordination.read_namespaced_lease,
                self.config.lease_name,
                self.config.namespace,
                timeout=timeout,
            )
        except ApiException as error:
            if error.status == 404:
                return NoLease.ABSENT
            logger.warning(
                "leader election: reading Lease %s failed: %s %s",
                self.config.lease,
                error.status,
                error.reason,
            )
            return NoLease.UNREADABLE
        except Exception as error:
            logger.warning("leader election: reading Lease %s failed: %s", self.config.lease, error)
            return NoLease.UNREADABLE
        self._sighting = sighted(self._sighting, LeaseRecord.from_lease(lease), time.monotonic())
        return self._sighting

    def _write(self, previous: LeaseRecord | None, spec: dict[str, Any], *, timeout: float) -> bool:
        """Create the Lease (none before) or replace it at the resourceVersion read; False when another
        replica wrote first (409) or the write failed."""
        from kubernetes.client.exceptions import ApiException

        metadata: dict[str, Any] = {"name": self.config.lease_name, "namespace": self.config.namespace}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
        try:
            if previous is None:
                self._call(
                    self._coordination.create_namespaced_lease, self.config.namespace, body, timeout=timeout
                )
            else:
                metadata["resourceVersion"] = previous.resource_version
                self._call(
                    self._coordination.replace_namespaced_lease,
                    self.config.lease_name,
                    self.config.namespace,
                    body,
                    timeout=timeout,
                )
        except ApiException as error:
            if error.status != 409:
                logger.warning(
                    "leader election: writing Lease %s failed: %s %s",
                    self.config.lease,
                    error.status,
                    error.reason,
                )
            return False
        except Exception as error:
            logger.warning("leader election: writing Lease %s failed: %s", self.config.lease, error)
            return False
        return True

    @staticmethod
    def _call(method: Callable[..., Any], *args: Any, timeout: float) -> dict[str, Any]:
        """One request, connecting and reading within `timeout` seconds in all."""
        half = max(timeout, 0.1) / 2
        response = method(*args, _preload_content=False, _request_timeout=(half, half))
        result: dict[str, Any] = json.loads(response.data)
        return result


async def lead(
    config: LeaderElectionConfig | None, api_client: Any, readiness: Readiness, metrics: OperatorMetrics
) -> LeaderElector | None:
    """Return once this replica may act: at once without election, else once it leads (`_startup`)."""
    if config is None:
        metrics.leader.set(1)
        return None

    def changed(leading: bool) -> None:
        readiness.leading = leading
        metrics.leader.set(1 if leading else 0)

    changed(False)
    elector = LeaderElector(election_client(api_client, metrics), config, on_change=changed)
    await elector.acquire()  # cancelled while standing by (SIGTERM): the candidate stops, holding nothing
    return elector


async def release(elector: LeaderElector | None) -> None:
    """At the end of `handlers._cleanup`, once every run's task has stopped."""
    if elector is not None:
        await elector.release()
