"""kopf wiring: one task per run, restarted with backoff after a failure, that runs the run's supervisor
(`run_supervisor.py`: its reconcile and its dispatcher); spec updates handed to it; and per namespace one
label-selected watch each of Jobs, Services and ConfigMaps (`WATCHED_KINDS`), feeding the runs and the
children index. Everything substantial lives in `run_supervisor`, `reconciliation` and `dispatcher`; this
module only connects them to kopf's lifecycle.

The per-run tasks are started and stopped from a watch-event handler, not a `kopf.daemon`: kopf puts a
finalizer on every object that has a daemon, so a run deleted while the operator is down would hang in
`Terminating` until it came back. Nothing needs to happen at deletion (owner references let the garbage
collector remove the children), so no handler of ours needs a finalizer, and kopf removes the one an older
operator version left.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import stamina

from asyncrl.agent_templates.renderer import RenderSettings, TemplateRenderer
from asyncrl.api import InvalidRunError
from asyncrl.api.types.meta import GROUP, PLURAL, VERSION
from asyncrl.operator import elector
from asyncrl.operator.diffbase import RunDiffBaseStorage
from asyncrl.operator.dispatcher.agent_pods import DEFAULT_START_TIMEOUT_SECONDS
from asyncrl.operator.health import HealthServer, Readiness, review_forever
from asyncrl.operator.kube import JSON, Kube, LabelWatch, count_requests
from asyncrl.operator.leadership import LeaderElectionConfig
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.reconciliation.child_index import ChildIndex
from asyncrl.operator.reconciliation.reconciler import read_template
from asyncrl.operator.retry import Backoff, one_line_reason
from asyncrl.operator.run_supervisor import RunSupervisor, invalid_reasons, parse_run, supervise_run
from asyncrl.operator.write_fence import WriteFence
from asyncrl.workloads import names

logger = logging.getLogger(__name__)


@dataclass
class OperatorConfig:
    """Filled from `asyncrl operator` flags and handed to the handlers through kopf's memo."""

    namespaces: list[str] = field(default_factory=list)  # empty: cluster-wide
    gateway_address: str = "service"  # "service": the run's Service DNS name; "localhost": 127.0.0.1:<port>
    api_client: Any = None
    render: RenderSettings = field(default_factory=RenderSettings)  # agent templates: pod policy and limits
    agent_start_timeout_seconds: float = DEFAULT_START_TIMEOUT_SECONDS  # dispatcher/agent_pods.py
    health_port: int = 0  # /healthz and /readyz (operator/health.py); 0: not served
    leader_election: LeaderElectionConfig | None = None  # None: act at once (operator/elector.py)


@dataclass
class Runtime:
    config: OperatorConfig
    kube: Kube
    metrics: OperatorMetrics
    renderer: TemplateRenderer
    supervisors: dict[tuple[str, str], RunSupervisor] = field(default_factory=dict)
    watches: list[LabelWatch] = field(default_factory=list)
    runs: dict[tuple[str, str], _RunTask] = field(default_factory=dict)
    index: ChildIndex = field(default_factory=ChildIndex)
    readiness: Readiness = field(default_factory=Readiness)
    health: HealthServer | None = None
    permissions_review: asyncio.Task[None] | None = None
    fence: WriteFence | None = None

    def watch(self, kind: str, namespace: str | None) -> None:
        """Start the label-selected watch of one kind of our objects in one scope."""
        watch = LabelWatch(
            self.kube,
            kind,
            namespace,
            deliver=functools.partial(self.deliver, kind),
            listed=functools.partial(self.listed, kind, namespace),
        )
        watch.start()
        self.watches.append(watch)

    def listed(self, kind: str, namespace: str | None, items: list[JSON]) -> None:
        """A watch's (re)listing: the index learns exactly what exists; Jobs are replayed to their runs."""
        self.index.listed(kind, namespace, items)
        if kind == "Job":
            for job in items:
                self.deliver(kind, "SYNC", job)

    def deliver(self, kind: str, event_type: str, item: JSON) -> None:
        self.index.apply(kind, event_type, item)
        labels = item["metadata"].get("labels") or {}
        supervisor = self.supervisors.get((item["metadata"]["namespace"], labels.get(names.LABEL_RUN) or ""))
        if supervisor is None:
            return
        if kind == "Job":
            supervisor.on_job_event(event_type, item)
        elif event_type == "DELETED":
            supervisor.reconciler.child_deleted()  # recreated now, not at a requeue


@dataclass
class _RunTask:
    uid: str
    task: asyncio.Task[None]


# Watched, one label-selected watch each per namespace: the agent and trainer Jobs, and the children a run's
# reconcile checks at every round (its index, not a GET). Secrets are not: the operator may not list them
# (docs/install.md), so the reconcile reads the key Secret by name, less often (reconciler.py).
WATCHED_KINDS = ("Job", "Service", "ConfigMap")
RESTART_BACKOFF = Backoff(first_seconds=10.0, max_seconds=60.0, jitter_seconds=2.0)
# At a graceful stop: runs stop (up to 10 s, all at once), writes in flight end (up to this), the Lease is
# released; inside the pod's default 30 s grace period.
FENCE_SECONDS = 10.0


class ForeverBackoffs:
    """kopf's first retry delays, then one every 30 s, without end. An iterable kopf iterates afresh for each
    request (an iterator would be shared, and used up, across requests)."""

    FIRST: tuple[float, ...] = (1, 1, 2, 3, 5, 8, 13, 21)
    THEN = 30.0

    def __iter__(self) -> Iterator[float]:
        yield from self.FIRST
        yield from itertools.repeat(self.THEN)


def _runtime(memo: Any) -> Runtime:
    runtime: Runtime = memo.runtime
    return runtime


@kopf.on.login()
def _login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf uses the same identity as our own client (in-cluster service account or the kubeconfig)."""
    configuration = memo.config.api_client.configuration
    api_key: dict[str, str] = configuration.api_key or {}
    authorization: str = api_key.get("BearerToken") or api_key.get("authorization") or ""
    scheme, _space, token = authorization.partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # Progress and diff-base go to annotations: the status belongs to our schema (kopf's would be pruned).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    # Large inline rows and templates are kept there as digests (256 KiB of annotations in all: diffbase.py).
    settings.persistence.diffbase_storage = RunDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.level = logging.WARNING
    # kopf's default gives up on a failing API call after 8 retries (about a minute), and a failed watch then
    # ends the whole operator: one namespace without the operator's Role (403) stopped the runs of every
    # other namespace too. It retries forever instead; readiness and the log say what is missing.
    settings.networking.error_backoffs = ForeverBackoffs()
    config: OperatorConfig = memo.config
    # With explicit namespaces there is nothing to discover: skip kopf's cluster-wide namespace scan, which
    # the least-privilege namespaced RBAC denies (kopf retried it for about a minute before handling runs).
    settings.scanning.disabled = bool(config.namespaces)
    metrics: OperatorMetrics = memo.metrics
    count_requests(
        config.api_client,
        lambda verb, resource: metrics.api_requests.labels(verb, resource).inc(),
        lambda status: metrics.errors.labels("forbidden" if status == 403 else "unauthorized").inc(),
    )
    runtime = Runtime(
        config=config,
        kube=Kube(config.api_client),
        metrics=memo.metrics,
        renderer=TemplateRenderer(config.render),
        fence=WriteFence.install(config.api_client),
    )
    memo.runtime = runtime
    if config.health_port:
        runtime.health = HealthServer(config.health_port, runtime.readiness)
        await runtime.health.start()
    runtime.permissions_review = asyncio.create_task(
        review_forever(
            config.api_client,
            config.namespaces or [""],
            runtime.readiness,
            metrics,
            also=elector.required_permissions(config.leader_election),
        ),
        name="permissions-review",
    )
    # kopf starts its watches only once this handler returns: a standby waits here, doing nothing else.
    memo.elector = await elector.lead(config.leader_election, config.api_client, runtime.readiness, metrics)
    scopes: list[str | None] = list(config.namespaces) or [None]
    for namespace in scopes:
        for kind in WATCHED_KINDS:
            runtime.watch(kind, namespace)


@kopf.on.cleanup()
async def _cleanup(memo: Any, **_: Any) -> None:
    runtime = _runtime(memo)
    if runtime.permissions_review is not None:
        runtime.permissions_review.cancel()
    if runtime.health is not None:
        await runtime.health.stop()
    for watch in runtime.watches:
        watch.stop()
    # All at once: one after another, 100 runs waiting up to 10 s each outlast the pod's grace period, and the
    # Lease would then expire instead of being released.
    await asyncio.gather(*(_stop_run(runtime, key) for key in list(runtime.runs)))
    await runtime.renderer.close()
    if runtime.fence is not None:  # a call already in a worker thread may still be on its way
        await asyncio.to_thread(runtime.fence.close, FENCE_SECONDS)
    await elector.release(memo.get("elector"))  # last: no run writes any more


@kopf.on.event(GROUP, VERSION, PLURAL)
async def run_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Start a run's task when the run appears (or at operator start), stop it when the run goes away."""
    runtime = _runtime(memo)
    raw: JSON = dict(event["object"])
    metadata = raw.get("metadata") or {}
    key = (str(metadata.get("namespace")), str(metadata.get("name")))
    current = runtime.runs.get(key)
    if event["type"] == "DELETED" or metadata.get("deletionTimestamp"):
        await _stop_run(runtime, key)
        return
    if current is not None and current.uid == metadata.get("uid"):
        return  # already running (or finished for good, as an invalid run does)
    if current is not None:  # deleted and created again under the same name while we were not looking
        await _stop_run(runtime, key)
    task = asyncio.create_task(_supervise(runtime, copy.deepcopy(raw)), name=f"run-{key[0]}/{key[1]}")
    runtime.runs[key] = _RunTask(uid=str(metadata.get("uid")), task=task)


async def _stop_run(runtime: Runtime, key: tuple[str, str]) -> None:
    entry = runtime.runs.pop(key, None)
    if entry is None:
        return
    entry.task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(entry.task, timeout=10)


async def _supervise(runtime: Runtime, body: JSON) -> None:
    """Run the run's supervisor; after a failure, start it again with backoff (as kopf retried the daemon).

    stamina waits: the delay a `kopf.TemporaryError` names, else the restart backoff's next delay."""
    name = body["metadata"]["name"]

    def restart_wait(error: BaseException) -> float | bool:
        if isinstance(error, kopf.TemporaryError) and error.delay is not None:
            return float(error.delay)
        return isinstance(error, Exception)  # tenacity hands over a cancellation too: never restart on one

    async for attempt in stamina.retry_context(
        on=restart_wait, attempts=None, timeout=None, **RESTART_BACKOFF.stamina_waits()
    ):
        if attempt.num > 1:
            with contextlib.suppress(Exception):  # start again from the run as it is now
                body = await runtime.kube.read_run(body["metadata"]["namespace"], name)
        with attempt:
            try:
                await run_controller(body, runtime)
            except Exception as error:
                logger.error(
                    "run %s: the controller stopped: %s; restarting in %.0f s",
                    name,
                    one_line_reason(error),
                    restart_delay(error, attempt.next_wait),
                    exc_info=not isinstance(error, kopf.TemporaryError),
                )
                raise
            return


def restart_delay(error: BaseException, backoff_seconds: float) -> float:
    """How long to wait before starting a run's supervisor again: the delay a TemporaryError names, else the
    backoff's next delay."""
    if isinstance(error, kopf.TemporaryError) and error.delay is not None:
        return float(error.delay)
    return backoff_seconds


def _reference(body: Mapping[str, Any]) -> JSON:
    """The run as much as an Event needs (apiVersion, kind, metadata), without parsing its spec."""
    return {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": dict(body["metadata"])}


async def run_controller(body: Mapping[str, Any], runtime: Runtime) -> None:
    """Serve the run (its supervisor: the reconcile, then the dispatcher) until cancelled."""
    key = (str(body["metadata"]["namespace"]), str(body["metadata"]["name"]))
    mine: list[RunSupervisor] = []

    def register(supervisor: RunSupervisor | None) -> None:
        if supervisor is not None:
            mine.append(supervisor)
            runtime.supervisors[key] = supervisor
        elif mine and runtime.supervisors.get(key) is mine[0]:
            del runtime.supervisors[key]

    await supervise_run(
        body,
        kube=runtime.kube,
        metrics=runtime.metrics,
        renderer=runtime.renderer,
        index=runtime.index,
        gateway_address=runtime.config.gateway_address,
        agent_start_timeout_seconds=runtime.config.agent_start_timeout_seconds,
        register=register,
    )


def _field_path(path: tuple[str, ...]) -> str:
    parts = list(path)[1:] if path and path[0] == "spec" else list(path)  # kopf's path, relative or not
    return ".".join(str(part) for part in parts) or "spec"


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def spec_updated(body: kopf.Body, memo: Any, diff: Any, **_: Any) -> None:
    """Apply an admitted spec edit to the running run and say so in an event: the fields that may change
    mid-run are listed, with their effect, in docs/crd-reference.md (the others are refused at admission)."""
    runtime = _runtime(memo)
    try:
        run, spec = parse_run(body)
    except InvalidRunError as error:  # the run goes on with the spec it had
        message = f"spec change ignored: {invalid_reasons(error)}"
        logger.error("run %s: %s", body["metadata"]["name"], message)
        await runtime.kube.post_event(_reference(body), reason="InvalidSpec", message=message, warning=True)
        return
    namespace, name = run["metadata"]["namespace"], run["metadata"]["name"]
    supervisor = runtime.supervisors.get((namespace, name))
    if supervisor is None:
        return  # the run's task starts (again) from the spec as it is now
    try:
        template = await read_template(runtime.kube, namespace, spec)
    except Exception as error:  # a ConfigMap named by the new spec may not exist yet
        message = f"spec change not applied: the agent template cannot be read: {one_line_reason(error)}"
        await runtime.kube.post_event(run, reason="SpecChangeFailed", message=message, warning=True)
        return
    supervisor.update_spec(run, spec, template)
    changed = sorted({_field_path(change[1]) for change in diff or ()})
    await runtime.kube.post_event(
        run,
        reason="SpecChanged",
        message=f"applied: {', '.join(changed) or 'spec'} (see docs/crd-reference.md)",
    )
