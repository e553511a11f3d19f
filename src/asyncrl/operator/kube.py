"""The operator's Kubernetes calls: create-or-get children, agent Jobs, status patches, Events, label watches.

The official client is synchronous; calls run in worker threads (`asyncio.to_thread`) so the operator's
event loop (kopf's) never blocks. Bodies and results are plain JSON dicts, the same shape as the manifests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from asyncrl.api.types.meta import API_VERSION, GROUP, KIND, PLURAL, VERSION
from asyncrl.operator.retry import one_line_reason
from asyncrl.workloads import names

logger = logging.getLogger(__name__)

JSON = dict[str, Any]


# RFC 7234 warn-value as the API server sends it: `299 - "text"`, quotes and backslashes escaped in the text.
_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def warning_texts(header_values: list[str]) -> list[str]:
    """The texts of `Warning` response headers (each header may hold several warn-values)."""
    texts = []
    for value in header_values:
        for match in _WARNING.finditer(value or ""):
            texts.append(re.sub(r"\\(.)", r"\1", match.group(1)))
    return texts


WATCH_RETRY_MAX_SECONDS = 30.0


def request_labels(method: str, url: str) -> tuple[str, str]:
    """(verb, resource) of one Kubernetes API request, as the API server's own metrics name them: GET is
    `get` for one object, `list` for a collection and `watch` with `watch=true`; the resource is
    `group/resource/subresource`, core resources without a group."""
    split = urllib.parse.urlsplit(url)
    parts = [part for part in split.path.split("/") if part]
    group = ""
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return method.lower(), "(none)"
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]  # a namespaced object; `namespaces/<ns>` alone is the namespace itself
    resource = "/".join(part for part in (group, *rest[:1], *rest[2:3]) if part) or "(none)"
    verb = method.lower()
    if verb == "get":
        watching = urllib.parse.parse_qs(split.query).get("watch", [""])[0].lower() in ("true", "1")
        verb = "watch" if watching else ("get" if len(rest) >= 2 else "list")
    return verb, resource


def count_requests(
    api_client: Any,
    counted: Callable[[str, str], None],
    refused: Callable[[int], None] = lambda status: None,
) -> None:
    """Call `counted(verb, resource)` for every request the client makes (its REST layer, every thread), and
    `refused(status)` for each the API server answered 401 or 403 (the REST layer returns such a response;
    the API classes raise ApiException from it afterwards)."""
    rest = api_client.rest_client
    request = rest.request

    def counting(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        counted(*request_labels(method, url))
        response = request(method, url, *args, **kwargs)
        if response.status in (401, 403):
            refused(response.status)
        return response

    rest.request = counting


class Kube:
    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core: Any = client.CoreV1Api(api_client)
        self.batch: Any = client.BatchV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.apps: Any = client.AppsV1Api(api_client)

    @staticmethod
    def _json(response: Any) -> JSON:
        result: JSON = json.loads(response.data)
        return result

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        response = await asyncio.to_thread(method, *args, _preload_content=False, **kwargs)
        return self._json(response)

    # -- children -----------------------------------------------------------------------------------------

    async def create_or_get(self, body: JSON) -> tuple[JSON, bool, list[str]]:
        """Create `body` unless an object of that name exists; return (object, created, the API server's
        warnings on the creation, e.g. a pod template that would violate the namespace's Pod Security)."""
        from kubernetes.client.exceptions import ApiException

        kind, namespace, name = body["kind"], body["metadata"]["namespace"], body["metadata"]["name"]
        create, read = self._methods(kind)
        try:
            response = await asyncio.to_thread(create, namespace, body, _preload_content=False)
        except ApiException as error:
            if error.status != 409:
                raise
            return await self._call(read, name, namespace), False, []
        headers = response.headers
        values = headers.getlist("Warning") if hasattr(headers, "getlist") else [headers.get("Warning") or ""]
        return self._json(response), True, warning_texts(values)

    def _methods(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        table = {
            "Secret": (self.core.create_namespaced_secret, self.core.read_namespaced_secret),
            "ConfigMap": (self.core.create_namespaced_config_map, self.core.read_namespaced_config_map),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "Job": (self.batch.create_namespaced_job, self.batch.read_namespaced_job),
            "Deployment": (self.apps.create_namespaced_deployment, self.apps.read_namespaced_deployment),
        }
        return table[kind]

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Set a Deployment's replicas (the agent pool's size)."""
        await self._call(
            self.apps.patch_namespaced_deployment, name, namespace, {"spec": {"replicas": replicas}}
        )

    async def list_pod_names(self, namespace: str, label_selector: str) -> list[str]:
        listing = await self._call(self.core.list_namespaced_pod, namespace, label_selector=label_selector)
        return [str(pod["metadata"]["name"]) for pod in listing.get("items") or []]

    async def read_secret_key(self, namespace: str, name: str, key: str) -> str:
        import base64

        secret = await self._call(self.core.read_namespaced_secret, name, namespace)
        data = secret.get("data") or {}
        if key not in data:
            raise KeyError(f"secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(data[key]).decode()

    async def read_config_map_key(self, namespace: str, name: str, key: str) -> str:
        config_map = await self._call(self.core.read_namespaced_config_map, name, namespace)
        data = config_map.get("data") or {}
        if key not in data:
            raise KeyError(f"configmap {namespace}/{name} has no key {key!r}")
        return str(data[key])

    async def read_job(self, namespace: str, name: str) -> JSON | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return await self._call(self.batch.read_namespaced_job, name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def patch_job(self, namespace: str, name: str, patch: JSON) -> None:
        await self._call(self.batch.patch_namespaced_job, name, namespace, patch)

    async def exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether a child of that kind and name exists (a GET; 404 is False)."""
        from kubernetes.client.exceptions import ApiException

        _, read = self._methods(kind)
        try:
            await self._call(read, name, namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    # -- custom objects (a multi-node run's RayCluster), claims and pods -----------------------------------

    async def create_custom(self, group: str, version: str, plural: str, body: JSON) -> JSON:
        namespace = body["metadata"]["namespace"]
        return await self._call(
            self.custom.create_namespaced_custom_object, group, version, namespace, plural, body
        )

    async def read_custom(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> JSON | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return await self._call(
                self.custom.get_namespaced_custom_object, group, version, namespace, plural, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def patch_custom(
        self, group: str, version: str, plural: str, namespace: str, name: str, patch: JSON
    ) -> None:
        await self._call(
            self.custom.patch_namespaced_custom_object, group, version, namespace, plural, name, patch
        )

    async def read_claim(self, namespace: str, name: str) -> JSON:
        """A PersistentVolumeClaim (ApiException 404 when absent)."""
        return await self._call(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    async def list_pods(self, namespace: str, label_selector: str) -> list[JSON]:
        listing = await self._call(self.core.list_namespaced_pod, namespace, label_selector=label_selector)
        return list(listing.get("items") or [])

    # -- agent Jobs ---------------------------------------------------------------------------------------

    async def create_job(self, body: JSON, *, dry_run: bool = False) -> bool:
        """Create an agent Job (one attempt); False when a Job of that name exists. Errors are raised as the
        client raised them: the caller decides what is transient (`retry.kube_error_is_transient`).

        `dry_run`: the API server validates and admits the Job (schema, label syntax, admission webhooks)
        and stores nothing."""
        from kubernetes.client.exceptions import ApiException

        extra = {"dry_run": "All"} if dry_run else {}
        try:
            await self._call(self.batch.create_namespaced_job, body["metadata"]["namespace"], body, **extra)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and, in the background, its pods (no orphans)."""
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(
                self.batch.delete_namespaced_job, name, namespace, body={"propagationPolicy": "Background"}
            )
        except ApiException as error:
            if error.status != 404:
                raise

    async def list_agent_jobs(self, namespace: str, run: str) -> list[JSON]:
        selector = f"{names.AGENT_JOB_SELECTOR},{names.LABEL_RUN}={run}"
        listing = await self._call(self.batch.list_namespaced_job, namespace, label_selector=selector)
        items: list[JSON] = listing["items"]
        return items

    # -- the run ------------------------------------------------------------------------------------------

    async def patch_run_status(self, namespace: str, name: str, status: JSON) -> None:
        await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
        )

    async def patch_run_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge `annotations` into the run's metadata (the spec and status are left alone)."""
        await self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
        )

    async def read_run(self, namespace: str, name: str) -> JSON:
        return await self._call(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
        )

    async def post_event(self, run: JSON, *, reason: str, message: str, warning: bool = False) -> None:
        """A Kubernetes Event on the run (what `kubectl describe atr` shows); failures are only logged."""
        metadata = run["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # kubectl's convention: <object>.<unique suffix> (generateName may not end in a dot).
            "metadata": {
                "name": f"{metadata['name']}.{secrets.token_hex(8)}",
                "namespace": metadata["namespace"],
            },
            "eventTime": now,
            "reportingController": f"{GROUP}/operator",
            "reportingInstance": "asyncrl-operator",
            "action": reason,
            "reason": reason,
            "note": message[:1024],
            "type": "Warning" if warning else "Normal",
            "regarding": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata["uid"],
            },
        }
        from kubernetes import client

        try:
            events: Any = client.EventsV1Api(self.api_client)
            await asyncio.to_thread(
                events.create_namespaced_event, metadata["namespace"], event, _preload_content=False
            )
        except Exception as error:
            logger.warning("could not post event %s on %s: %s", reason, metadata["name"], error)


METADATA_ONLY = frozenset({"Service", "ConfigMap"})  # kinds watched for their names alone


class LabelWatch:
    """One server-side label-selected watch of one kind of our objects per namespace (or cluster-wide),
    delivered into the event loop: Jobs (the agents' and the trainer's), Services and ConfigMaps.

    kopf's label filters are evaluated client-side over a watch of every object in scope, so this watch uses
    the API server's label selector instead. It runs in a thread (the client is synchronous) and hands each
    listing to `listed` and each event to `deliver` on the operator's loop, in order; after a disconnect it
    relists, so no state is missed (a child deleted meanwhile is absent from the new listing).
    """

    _LISTS: ClassVar[dict[str, tuple[str, str, str]]] = {  # kind: (API, namespaced, cluster-wide list)
        "Job": ("batch", "list_namespaced_job", "list_job_for_all_namespaces"),
        "Service": ("core", "list_namespaced_service", "list_service_for_all_namespaces"),
        "ConfigMap": ("core", "list_namespaced_config_map", "list_config_map_for_all_namespaces"),
    }

    def __init__(
        self,
        kube: Kube,
        kind: str,
        namespace: str | None,
        *,
        deliver: Callable[[str, JSON], None],
        listed: Callable[[list[JSON]], None],
    ) -> None:
        api, namespaced, everywhere = self._LISTS[kind]
        self.kind = kind
        self.namespace = namespace
        self._list_call: Callable[..., Any] = getattr(
            getattr(kube, api), namespaced if namespace else everywhere
        )
        self.deliver = deliver
        self.listed = listed
        self._loop = asyncio.get_running_loop()
        self._stopping = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(
            target=self._run, name=f"{kind.lower()}-watch-{namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()

    def _list(self, **kwargs: Any) -> Any:
        if self.kind in METADATA_ONLY:
            # Names are all the index needs: the API server sends metadata, not a ConfigMap's data (a run's
            # run.yaml may carry up to 1 MiB of inline rows) or a Service's spec.
            shape = "PartialObjectMetadata" if kwargs.get("watch") else "PartialObjectMetadataList"
            kwargs["_headers"] = {"Accept": f"application/json;as={shape};g=meta.k8s.io;v=v1"}
        if self.namespace:
            return self._list_call(self.namespace, **kwargs)
        return self._list_call(**kwargs)

    def _run(self) -> None:
        from kubernetes import watch

        resource_version = ""
        failures = 0
        while not self._stopping.is_set():
            try:
                if not resource_version:
                    listing = json.loads(
                        self._list(label_selector=names.MANAGED_SELECTOR, _preload_content=False).data
                    )
                    failures = 0
                    resource_version = listing["metadata"]["resourceVersion"]
                    items = listing.get("items") or []  # null in an empty metadata-only listing
                    self._loop.call_soon_threadsafe(self.listed, items)
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                stream = self._watch.stream(
                    self._list,
                    label_selector=names.MANAGED_SELECTOR,
                    resource_version=resource_version,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if self._stopping.is_set():
                        return
                    raw: JSON = event["raw_object"]
                    if event["type"] == "ERROR":
                        resource_version = ""
                        break
                    resource_version = raw["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._loop.call_soon_threadsafe(self.deliver, event["type"], raw)
            except Exception as error:
                if self._stopping.is_set():
                    return
                failures += 1
                # 1 s, doubling to 30 s while it keeps failing (a missing Role: 403 until it is bound).
                delay = min(WATCH_RETRY_MAX_SECONDS, 2.0 ** (failures - 1))
                logger.warning(
                    "%s watch (%s) failed, relisting in %.0f s: %s",
                    self.kind,
                    self.namespace or "all",
                    delay,
                    one_line_reason(error),
                )
                resource_version = ""
                self._stopping.wait(delay)
