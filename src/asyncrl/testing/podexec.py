"""Run one bound pod's containers as local processes and report truthful status, as a kubelet would.

Covers what our operator's pods use: init containers, native sidecars (init containers with
`restartPolicy: Always`, started first and stopped after the main containers), restart policies, env and
envFrom from Secrets/ConfigMaps/fieldRefs, ConfigMap/Secret/emptyDir/downwardAPI/projected/hostPath volumes
(materialized in a folder, container paths rewritten to it), persistentVolumeClaim volumes (one folder per
claim, shared by the pods that mount it), and httpGet/tcpSocket/exec readiness probes.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from asyncrl.launch.podspec import ImageTable, container_argv, expand_references, map_paths, pod_field

logger = logging.getLogger(__name__)

JSON = dict[str, Any]
POLL_SECONDS = 0.1
MAX_GRACE_SECONDS = 10.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Adapts one container's process to this machine beyond the image table: (pod, container spec, argv, env) ->
# (argv, env). KubeRay's pods need one (asyncrl.testing.kuberay_pods): generated shell commands, service host
# names and fixed ports that pods sharing one host cannot all hold.
ContainerRewrite = Callable[[JSON, JSON, list[str], dict[str, str]], tuple[list[str], dict[str, str]]]


class PodSetupError(Exception):
    """The pod cannot start; `reason` is the kubelet-style waiting reason (e.g. ErrImageNeverPull)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Container:
    spec: JSON
    sidecar: bool = False
    process: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    log_path: Path = Path()
    restart_count: int = 0
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: JSON = field(default_factory=dict)
    ready: bool = False
    next_probe: float = 0.0
    restart_at: float | None = None
    exit_handled: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        terminated = self.state.get("terminated")
        return None if terminated is None else int(terminated["exitCode"])

    def status(self) -> JSON:
        status: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": f"asyncrl-local://{self.spec.get('image', '')}",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.running(),
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.process is not None:
            status["containerID"] = f"asyncrl-local://{self.process.pid}"
        return status


class PodExecution(threading.Thread):
    """The life of one pod on the fake node, in its own thread; `request_stop()` is a graceful delete."""

    def __init__(
        self,
        *,
        pod: JSON,
        core: Any,
        images: ImageTable,
        pod_dir: Path,
        base_env: Mapping[str, str],
        rewrite: ContainerRewrite | None = None,
    ) -> None:
        metadata = pod["metadata"]
        super().__init__(name=f"pod-{metadata['namespace']}/{metadata['name']}", daemon=True)
        self.pod = pod
        self.core = core
        self.images = images
        self.pod_dir = pod_dir
        self.base_env = dict(base_env)
        self.rewrite = rewrite
        self.namespace: str = metadata["namespace"]
        self.pod_name: str = metadata["name"]
        self.restart_policy: str = pod["spec"].get("restartPolicy", "Always")
        self._stop_requested = threading.Event()
        self._grace_seconds = MAX_GRACE_SECONDS
        self._phase = "Pending"
        self._start_time = _now()
        self._last_status: JSON | None = None
        self._mounts_by_volume: dict[str, Path] = {}
        init_specs = pod["spec"].get("initContainers") or []
        self.init_containers = [
            _Container(spec=spec, sidecar=spec.get("restartPolicy") == "Always") for spec in init_specs
        ]
        self.containers = [_Container(spec=spec) for spec in pod["spec"]["containers"]]

    def request_stop(self, grace_seconds: float | None = None) -> None:
        if grace_seconds is not None:
            self._grace_seconds = min(max(grace_seconds, 0.0), MAX_GRACE_SECONDS)
        self._stop_requested.set()

    def log_path(self, container: str) -> Path:
        return self.pod_dir / f"{container}.log"

    # -- lifecycle ----------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            logger.exception("pod %s/%s: runner error", self.namespace, self.pod_name)
            self._terminate_all()
            self._phase = "Failed"
            self._write_status(message="pod runner error; see the test log")

    def _run(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._materialize_volumes()
            for container in self.init_containers + self.containers:
                self._prepare(container)
        except PodSetupError as error:
            for container in self.init_containers + self.containers:
                container.state = {"waiting": {"reason": error.reason, "message": str(error)}}
            self._write_status()
            logger.warning("pod %s/%s cannot start: %s", self.namespace, self.pod_name, error)
            self._stop_requested.wait()
            return
        self._write_status()
        if not self._run_init_containers():
            return
        for container in self.containers:
            self._start(container)
        self._phase = "Running"
        self._write_status()
        self._supervise_main_containers()

    def _run_init_containers(self) -> bool:
        for container in self.init_containers:
            self._start(container)
            if container.sidecar:
                # A native sidecar counts as started once its process runs; the next container follows.
                self._write_status()
                continue
            while True:
                if self._stop_requested.wait(POLL_SECONDS):
                    self._finish_stopped()
                    return False
                self._keep_sidecars_alive()
                code = container.exit_code()
                if code is None:
                    continue
                self._record_exit(container, code)
                if code == 0:
                    break
                if self.restart_policy == "Never":
                    self._terminate_all()
                    self._phase = "Failed"
                    self._write_status()
                    return False
                time.sleep(1.0)
                self._start(container, restart=True)
            self._write_status()
        return True

    def _supervise_main_containers(self) -> None:
        while True:
            if self._stop_requested.wait(POLL_SECONDS):
                self._finish_stopped()
                return
            self._keep_sidecars_alive()
            now = time.monotonic()
            for container in self.containers:
                if container.restart_at is not None and now >= container.restart_at:
                    container.restart_at = None
                    self._start(container, restart=True)
                    continue
                if container.exit_handled or container.restart_at is not None:
                    continue
                code = container.exit_code()
                if code is None:
                    continue
                self._record_exit(container, code)
                container.exit_handled = True
                if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0):
                    container.restart_at = now + min(10.0, 1.0 * 2 ** min(container.restart_count, 3))
            self._probe_all()
            if all(c.exit_handled and c.restart_at is None for c in self.containers):
                self._stop_sidecars()
                codes = [c.state["terminated"]["exitCode"] for c in self.containers]
                self._phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
                self._write_status()
                logger.info("pod %s/%s %s (exit codes %s)", self.namespace, self.pod_name, self._phase, codes)
                return
            self._write_status()

    def _finish_stopped(self) -> None:
        self._terminate_all()
        if self._phase not in ("Succeeded", "Failed"):
            self._phase = "Failed"
        self._write_status(message="pod was deleted")

    # -- containers ---------------------------------------------------------------------------------------

    def _prepare(self, container: _Container) -> None:
        spec = container.spec
        image = self.images.lookup(spec.get("image", ""))
        if image is None:
            raise PodSetupError(
                "ErrImageNeverPull",
                f"image {spec.get('image')!r} is not in the test image table (known: {self.images.names()})",
            )
        mounts = self._container_mounts(spec)
        # Only what the pod spec says is rewritten to the mounts' local folders; the host side (the image
        # table's entrypoint and env, the runner's base env) already names real local paths, which may well
        # lie under a mount path such as /tmp.
        env = dict(self.base_env)
        env.update(image.env)
        env["HOSTNAME"] = self.pod_name
        resolved = self._resolve_env(spec, mounts)
        env.update({key: map_paths(value, mounts) for key, value in resolved.items()})
        container.env = env
        command = [map_paths(part, mounts) for part in spec.get("command") or []]
        args = [map_paths(part, mounts) for part in spec.get("args") or []]
        try:
            container.argv = container_argv(image, command, args, container.env)
        except ValueError as error:
            raise PodSetupError(
                "CreateContainerConfigError", f"container {container.name}: {error}"
            ) from error
        if self.rewrite is not None:
            container.argv, container.env = self.rewrite(self.pod, spec, container.argv, container.env)
        working_dir = spec.get("workingDir")
        container.cwd = map_paths(working_dir, mounts) if working_dir else str(self.pod_dir)
        container.log_path = self.log_path(container.name)

    def _start(self, container: _Container, *, restart: bool = False) -> None:
        if restart:
            container.restart_count += 1
            container.last_state = container.state
        container.exit_handled = False
        log = container.log_path.open("ab")
        try:
            container.process = subprocess.Popen(
                container.argv,
                env=container.env,
                cwd=container.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as error:
            container.process = None
            container.state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": f"{container.argv[0]}: {error.strerror}",
                    "startedAt": _now(),
                    "finishedAt": _now(),
                }
            }
            return
        finally:
            log.close()
        container.state = {"running": {"startedAt": _now()}}
        container.ready = container.spec.get("readinessProbe") is None
        container.next_probe = time.monotonic() + float(
            (container.spec.get("readinessProbe") or {}).get("initialDelaySeconds", 0)
        )
        logger.info(
            "pod %s/%s: started %s: %s", self.namespace, self.pod_name, container.name, container.argv
        )

    def _record_exit(self, container: _Container, code: int) -> None:
        if "terminated" in container.state:
            return  # a start error already recorded why
        started = container.state.get("running", {}).get("startedAt", _now())
        exit_code = code if code >= 0 else 128 - code  # killed by signal N → 128 + N
        container.state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started,
                "finishedAt": _now(),
            }
        }
        container.ready = False

    def _keep_sidecars_alive(self) -> None:
        for sidecar in self.init_containers:
            if sidecar.sidecar and sidecar.exit_code() is not None and not self._stop_requested.is_set():
                self._record_exit(sidecar, sidecar.exit_code() or 0)
                self._start(sidecar, restart=True)

    def _stop_containers(self, containers: list[_Container]) -> None:
        live = [c for c in containers if c.running()]
        for container in live:
            assert container.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self._grace_seconds
        for container in live:
            assert container.process is not None
            try:
                container.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(container.process.pid, signal.SIGKILL)
                container.process.wait()
            self._record_exit(container, container.process.returncode)

    def _stop_sidecars(self) -> None:
        self._stop_containers([c for c in reversed(self.init_containers) if c.sidecar])

    def _terminate_all(self) -> None:
        self._stop_containers(self.containers)
        self._stop_containers(list(reversed(self.init_containers)))

    # -- probes -------------------------------------------------------------------------------------------

    def _probe_all(self) -> None:
        now = time.monotonic()
        for container in self.init_containers + self.containers:
            probe = container.spec.get("readinessProbe")
            if probe is None or not container.running() or now < container.next_probe:
                continue
            container.next_probe = now + float(probe.get("periodSeconds", 10))
            container.ready = self._probe(probe, container)

    def _probe(self, probe: JSON, container: _Container) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            action = probe["httpGet"]
            port = self._resolve_port(action["port"], container)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            try:
                connection.request("GET", action.get("path", "/"))
                return 200 <= connection.getresponse().status < 400
            except OSError:
                return False
            finally:
                connection.close()
        if "tcpSocket" in probe:
            port = self._resolve_port(probe["tcpSocket"]["port"], container)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=timeout):
                    return True
            except OSError:
                return False
        if "exec" in probe:
            try:
                result = subprocess.run(
                    probe["exec"]["command"],
                    env=container.env,
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired):
                return False
            return result.returncode == 0
        return True

    @staticmethod
    def _resolve_port(port: int | str, container: _Container) -> int:
        if isinstance(port, int):
            return port
        for declared in container.spec.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
        return int(port)

    # -- env and volumes ----------------------------------------------------------------------------------

    def _resolve_env(self, spec: JSON, mounts: Mapping[str, str]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._config_map(
                    source["configMapRef"]["name"], source["configMapRef"].get("optional")
                )
            else:
                data = self._secret(source["secretRef"]["name"], source["secretRef"].get("optional"))
            env.update({prefix + key: value for key, value in data.items()})
        for variable in spec.get("env") or []:
            name = variable["name"]
            if "valueFrom" not in variable:
                env[name] = expand_references(variable.get("value", ""), {**self.base_env, **env})
                continue
            source = variable["valueFrom"]
            if "fieldRef" in source:
                env[name] = pod_field(self.pod, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self._secret(ref["name"], ref.get("optional")).get(ref["key"])
                if value is None and not ref.get("optional"):
                    raise PodSetupError(
                        "CreateContainerConfigError", f"key {ref['key']} not in secret {ref['name']}"
                    )
                if value is not None:
                    env[name] = value
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                value = self._config_map(ref["name"], ref.get("optional")).get(ref["key"])
                if value is None and not ref.get("optional"):
                    raise PodSetupError(
                        "CreateContainerConfigError", f"key {ref['key']} not in configmap {ref['name']}"
                    )
                if value is not None:
                    env[name] = value
            elif "resourceFieldRef" in source:
                resource = source["resourceFieldRef"]["resource"]
                kind, _, key = resource.partition(".")
                env[name] = str((spec.get("resources") or {}).get(kind, {}).get(key, "0"))
        return env

    def _config_map(self, name: str, optional: bool | None) -> dict[str, str]:
        try:
            config_map = self.core.read_namespaced_config_map(name, self.namespace)
        except Exception as error:
            if optional:
                return {}
            raise PodSetupError("CreateContainerConfigError", f"configmap {name!r} not found") from error
        return dict(config_map.data or {})

    def _secret(self, name: str, optional: bool | None) -> dict[str, str]:
        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except Exception as error:
            if optional:
                return {}
            raise PodSetupError("CreateContainerConfigError", f"secret {name!r} not found") from error
        return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}

    def _container_mounts(self, spec: JSON) -> dict[str, str]:
        mounts: dict[str, str] = {}
        for mount in spec.get("volumeMounts") or []:
            volume_dir = self._mounts_by_volume.get(mount["name"])
            if volume_dir is None:
                raise PodSetupError("CreateContainerConfigError", f"volume {mount['name']!r} is not defined")
            local = volume_dir / mount["subPath"] if mount.get("subPath") else volume_dir
            mounts[mount["mountPath"]] = str(local)
        return mounts

    def _materialize_volumes(self) -> None:
        root = self.pod_dir / "volumes"
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "hostPath" in volume:
                self._mounts_by_volume[name] = Path(volume["hostPath"]["path"])
                continue
            if "persistentVolumeClaim" in volume:
                # One folder per claim, shared by every pod that mounts it (ReadWriteMany on one host);
                # it outlives the pods, as a claim's volume does.
                claim = volume["persistentVolumeClaim"]["claimName"]
                shared = self.pod_dir.parent.parent / "claims" / f"{self.namespace}_{claim}"
                shared.mkdir(parents=True, exist_ok=True)
                self._mounts_by_volume[name] = shared
                continue
            target = root / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            if "emptyDir" in volume:
                pass
            elif "configMap" in volume:
                source = volume["configMap"]
                self._write_items(target, self._config_map(source["name"], source.get("optional")), source)
            elif "secret" in volume:
                source = volume["secret"]
                self._write_items(target, self._secret(source["secretName"], source.get("optional")), source)
            elif "downwardAPI" in volume:
                self._write_downward(target, volume["downwardAPI"].get("items") or [])
            elif "projected" in volume:
                self._write_projected(target, volume["projected"].get("sources") or [])
            else:
                kinds = sorted(set(volume) - {"name"})
                raise PodSetupError(
                    "CreateContainerConfigError", f"volume {name!r}: unsupported type {kinds}"
                )
            self._mounts_by_volume[name] = target

    @staticmethod
    def _write_items(target: Path, data: Mapping[str, str], source: JSON) -> None:
        items = source.get("items")
        selected = {item["key"]: item["path"] for item in items} if items else {key: key for key in data}
        for key, path in selected.items():
            if key in data:
                file = target / path
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_text(data[key])

    def _write_downward(self, target: Path, items: list[JSON]) -> None:
        for item in items:
            if "fieldRef" in item:
                path = target / item["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(pod_field(self.pod, item["fieldRef"]["fieldPath"]))

    def _write_projected(self, target: Path, sources: list[JSON]) -> None:
        for source in sources:
            if "configMap" in source:
                ref = source["configMap"]
                self._write_items(target, self._config_map(ref["name"], ref.get("optional")), ref)
            elif "secret" in source:
                ref = source["secret"]
                self._write_items(target, self._secret(ref["name"], ref.get("optional")), ref)
            elif "downwardAPI" in source:
                self._write_downward(target, source["downwardAPI"].get("items") or [])
            # serviceAccountToken sources need a kubelet-issued token; the test plane has no kubelet.

    # -- status -------------------------------------------------------------------------------------------

    def _write_status(self, message: str | None = None) -> None:
        initialized = all(
            ("running" in c.state)
            if c.sidecar
            else ("terminated" in c.state and c.state["terminated"]["exitCode"] == 0)
            for c in self.init_containers
        )
        containers_ready = all(c.ready for c in self.containers) and self._phase == "Running"
        conditions = [
            ("PodScheduled", True),
            ("Initialized", initialized),
            ("ContainersReady", containers_ready),
            ("Ready", containers_ready),
        ]
        status: JSON = {
            "phase": self._phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self._start_time,
            "conditions": [{"type": kind, "status": "True" if ok else "False"} for kind, ok in conditions],
            "initContainerStatuses": [c.status() for c in self.init_containers],
            "containerStatuses": [c.status() for c in self.containers],
        }
        if message:
            status["message"] = message
        if status == self._last_status:
            return
        stamped = {
            **status,
            "conditions": [{**condition, "lastTransitionTime": _now()} for condition in status["conditions"]],
        }
        try:
            self.core.patch_namespaced_pod_status(self.pod_name, self.namespace, {"status": stamped})
            self._last_status = status
        except Exception as error:  # the pod may be gone already; the next change retries
            logger.debug("pod %s/%s: status write failed: %s", self.namespace, self.pod_name, error)
