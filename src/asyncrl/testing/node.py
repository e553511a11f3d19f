"""A test cluster with a real node: pods run in real containers, without kind or Docker.

The control plane of `asyncrl.testing.controlplane` proves the API's semantics; what it cannot show is how our
pods behave on a kubelet (images, service-account tokens, DNS, Services, native sidecars, logs and
port-forward). This harness adds a node to it: containerd with the CRI plugin, the kubelet, kube-scheduler,
kube-proxy and CoreDNS, all as processes of this machine, from the binaries and images
`scripts/provision-node.sh` provisions (it names them in an env file).

Every process runs in a network namespace of the node's own (`asyncrl.testing.netns`), joined to the machine
by a veth with a private /30: the API server, the kubelet and CoreDNS listen on the namespace's end of it,
the CNI bridge, pod and Service addresses and kube-proxy's iptables rules exist only inside it. The machine
(pytest, kubectl) reaches the API server at that address. Stopping the cluster stops every process it
started (by process group), removes its pods through the CRI, unmounts what the node mounted, removes its
cgroup subtree and deletes the namespace (`asyncrl.testing.hoststate`). A node whose owner died (a killed
test run) is found by its record under /run/asyncrl-node and removed the same way when the next one starts
(`asyncrl.testing.noderecord`).

`python -m asyncrl.testing.node up` brings a cluster up in the foreground, prints `export KUBECONFIG=...`
and stops it on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from asyncrl.launch.processes import free_port
from asyncrl.testing import hoststate, netns, nodeconfig
from asyncrl.testing.controlplane import (
    CONTROLLERS,
    REQUIRED_BINARIES,
    Component,
    ControlPlane,
    ControlPlaneError,
    cache_root,
    log_tail,
)
from asyncrl.testing.imagestore import ImageStore, pin_name
from asyncrl.testing.noderecord import (
    RUN_DIR,
    NodeRecord,
    process_start_time,
    remove_host_state,
    sweep_stale_nodes,
)

logger = logging.getLogger(__name__)

NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
# What a cluster with a node needs beyond the operator's controllers: Service endpoints for kube-proxy and
# CoreDNS, the CA ConfigMap every pod's token volume projects, node health, and removal of orphaned pods.
NODE_CONTROLLERS = (
    *CONTROLLERS,
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "root-ca-certificate-publisher-controller",
    "serviceaccount-token-controller",
    "pod-garbage-collector-controller",
    "node-lifecycle-controller",
    "daemonset-controller",
    "statefulset-controller",
)
PROVISION_HINT = "run scripts/provision-node.sh"
CONTAINERD_NAMESPACE = "k8s.io"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NodeClusterError(RuntimeError):
    """The node cluster could not be provisioned or started; the message says which part and why."""


def default_env_file() -> Path:
    """Where `scripts/provision-node.sh` writes its env file (`ASYNCRL_NODE_ENV` overrides it)."""
    explicit = os.environ.get("ASYNCRL_NODE_ENV")
    if explicit:
        return Path(explicit)
    return cache_root() / "node" / "node.env"


@dataclass(frozen=True)
class NodeTools:
    """The binaries and image tarballs named by the provisioning env file."""

    k8s_bin_dir: Path
    coredns: Path
    crictl: Path
    containerd: Path
    ctr: Path
    runc: Path
    cni_bin_dir: Path
    pause_image: str
    pause_tar: Path
    busybox_image: str
    busybox_tar: Path

    @classmethod
    def from_env_file(cls, path: Path) -> NodeTools:
        values: dict[str, str] = {}
        for line in path.read_text().splitlines():
            key, separator, value = line.partition("=")
            if separator and not key.startswith("#"):
                values[key.strip()] = value.strip()

        def get(key: str) -> str:
            try:
                return values[f"ASYNCRL_NODE_{key}"]
            except KeyError:
                raise NodeClusterError(
                    f"{path} names no ASYNCRL_NODE_{key}: {PROVISION_HINT} again"
                ) from None

        return cls(
            k8s_bin_dir=Path(get("K8S_BIN_DIR")),
            coredns=Path(get("COREDNS")),
            crictl=Path(get("CRICTL")),
            containerd=Path(get("CONTAINERD")),
            ctr=Path(get("CTR")),
            runc=Path(get("RUNC")),
            cni_bin_dir=Path(get("CNI_BIN_DIR")),
            pause_image=get("PAUSE_IMAGE"),
            pause_tar=Path(get("PAUSE_TAR")),
            busybox_image=get("BUSYBOX_IMAGE"),
            busybox_tar=Path(get("BUSYBOX_TAR")),
        )

    def missing(self) -> list[str]:
        executables = [
            *(self.k8s_bin_dir / name for name in (*REQUIRED_BINARIES, *NODE_BINARIES)),
            self.coredns,
            self.crictl,
            self.containerd,
            self.ctr,
            self.runc,
            *(self.cni_bin_dir / plugin for plugin in ("bridge", "host-local", "portmap", "loopback")),
        ]
        missing = [str(path) for path in executables if not os.access(path, os.X_OK)]
        missing += [str(path) for path in (self.pause_tar, self.busybox_tar) if not path.is_file()]
        return missing


def missing_prerequisites(env_file: Path | None = None) -> list[str]:
    """Why a node cluster cannot start here (empty when it can): not root, a tool or a provisioned file
    missing. Each reason names what to do."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not running as root (a node needs network namespaces, mounts and cgroups)")
    for tool in ("nsenter", "ip", "iptables", "mount", "busybox"):
        if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}") is None:
            reasons.append(f"{tool} is not installed ({PROVISION_HINT})")
    env_file = env_file or default_env_file()
    if not env_file.is_file():
        reasons.append(f"{env_file} does not exist ({PROVISION_HINT})")
        return reasons
    try:
        missing = NodeTools.from_env_file(env_file).missing()
    except NodeClusterError as error:
        return [*reasons, str(error)]
    if missing:
        reasons.append(f"missing {', '.join(missing)} ({PROVISION_HINT})")
    return reasons


# --- the cluster -------------------------------------------------------------------------------------------


def _http_status(url: str, *, token: str = "", timeout: float = 2.0) -> int | None:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context()
    # Readiness only: certificates are generated at start; clients verify them with the kubeconfig's CA.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class NodeCluster:
    """A control plane with one real node (containerd, kubelet, kube-proxy, CoreDNS) in a network namespace
    of its own; use as a context manager.

    After `start()`: `kubeconfig` (an admin identity), `server` (the API URL, reachable from this machine),
    `node_name`, `node_address`, `tools` (what was provisioned: the busybox image's name, ...).
    """

    env_file: Path = field(default_factory=default_env_file)
    work_dir: Path | None = None
    images: tuple[Path, ...] = ()  # image tarballs to import at start, beside the pause and busybox images
    # Keep containerd's images in the cache for the next node (asyncrl.testing.imagestore); False: per run.
    cache_images: bool = True
    start_timeout_seconds: float = 300.0
    # A namespace named like ours with no owner record is someone's crashed run once it is this old.
    stale_after_seconds: float = 600.0
    tools: NodeTools | None = None
    link: netns.NodeLink | None = None
    control_plane: ControlPlane | None = None
    kubeconfig: Path = Path()
    server: str = ""
    _components: list[Component] = field(default_factory=list)
    _record: NodeRecord | None = None
    _owns_work_dir: bool = False
    _snapshotter: str = "overlayfs"
    _client_pki: nodeconfig.ClientPki | None = None
    _image_store: ImageStore | None = None

    def __enter__(self) -> NodeCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- properties -------------------------------------------------------------------------------------

    @property
    def _tools(self) -> NodeTools:
        assert self.tools is not None, "the node cluster is not started"
        return self.tools

    @property
    def _work(self) -> Path:
        assert self.work_dir is not None, "the node cluster is not started"
        return self.work_dir

    @property
    def node_name(self) -> str:
        assert self.link is not None, "the node cluster is not started"
        return self.link.name

    @property
    def node_address(self) -> str:
        assert self.link is not None, "the node cluster is not started"
        return self.link.node_address

    @property
    def network(self) -> nodeconfig.NodeNetwork:
        return nodeconfig.NodeNetwork(node_name=self.node_name, node_address=self.node_address)

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / self.node_name

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        """Under the short run directory, not the work directory: the kubelet binds unix sockets there
        (pod-resources/<random>), and a path over 107 bytes fails with "bind: invalid argument" (a
        pytest-xdist worker's tmp_path with a long test name was one)."""
        return self.run_dir / "kubelet"

    @property
    def token(self) -> str:
        assert self.control_plane is not None
        return self.control_plane.token

    def kubectl(self) -> list[str]:
        """argv prefix for the provisioned kubectl pointed at this cluster."""
        assert self.tools is not None
        return [str(self.tools.k8s_bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}"]

    def crictl(self) -> list[str]:
        """argv prefix for crictl talking to the node's containerd."""
        assert self.tools is not None
        endpoint = f"unix://{self.containerd_socket}"
        return [
            str(self.tools.crictl),
            f"--runtime-endpoint={endpoint}",
            f"--image-endpoint={endpoint}",
            "--timeout=120s",  # (default 2 s) removing an image collects its garbage before it answers
        ]

    @property
    def log_paths(self) -> dict[str, Path]:
        paths = dict(self.control_plane.log_paths) if self.control_plane is not None else {}
        paths.update({component.name: component.log_path for component in self._components})
        return paths

    # -- start and stop ---------------------------------------------------------------------------------

    def start(self) -> None:
        reasons = missing_prerequisites(self.env_file)
        if reasons:
            raise NodeClusterError("cannot start a node here: " + "; ".join(reasons))
        self.tools = NodeTools.from_env_file(self.env_file)
        removed = sweep_stale_nodes(older_than_seconds=self.stale_after_seconds)
        if removed:
            logger.info("removed stale nodes: %s", ", ".join(removed))
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="asyncrl-node-"))
            self._owns_work_dir = True
        self.work_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            self.link = netns.create_link()
            owner_start = process_start_time(os.getpid())
            assert owner_start is not None
            self._record = NodeRecord(
                name=self.link.name,
                host_interface=self.link.host_interface,
                work_dir=str(self.work_dir),
                owner_pid=os.getpid(),
                owner_start_time=owner_start,
            )
            self._record.write()
            hoststate.create_cgroup_root(self.node_name)
            self._start_containerd()
            self.import_images([self.tools.pause_tar, self.tools.busybox_tar, *self.images])
            self._start_control_plane()
            self._start_scheduler()
            self._start_kubelet()
            self._start_kube_proxy()
            self._start_coredns()
            self._wait_for_service_accounts()
        except BaseException:
            self.stop()
            raise
        logger.info(
            "node cluster %s ready at %s in %.0f s (work dir %s)",
            self.node_name,
            self.server,
            time.monotonic() - started,
            self.work_dir,
        )

    def stop(self) -> None:
        """Stop every process, remove the pods, mounts, cgroups, namespace and veth; idempotent."""
        kubelet = next((c for c in self._components if c.name == "kubelet"), None)
        if kubelet is not None:
            kubelet.stop(grace_seconds=10)
        containerd = next((c for c in self._components if c.name == "containerd"), None)
        if containerd is not None and containerd.exited() is None:
            self._remove_all_pods()
        for component in reversed(self._components):
            component.stop(grace_seconds=10)
        if self._image_store is not None:
            self._image_store.release()
            self._image_store = None
        if self.control_plane is not None:
            self.control_plane.stop()
        if self._record is not None:
            keep = bool(os.environ.get("ASYNCRL_KEEP_NODE"))
            left = remove_host_state(self._record, remove_work_dir=self._owns_work_dir and not keep)
            if left:
                logger.warning("node %s: could not remove %s", self._record.name, ", ".join(left))
            self._record = None
        self._components.clear()

    def _remove_all_pods(self) -> None:
        """Stop and remove every pod sandbox through the CRI: the CNI plugins release their addresses and
        containerd unmounts the pods' namespaces and root filesystems."""
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self._crictl_or_warn("rmp", "--all", "--force", timeout=60)

    def _crictl_or_warn(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """crictl with `args`; a failure is logged with crictl's words and returned, not raised."""
        done = subprocess.run(
            [*self.crictl(), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            logger.warning("crictl %s: %s", " ".join(args), done.stderr.strip())
        return done

    def describe_failure(self) -> str:
        """The tail of every component's log (control plane and node), for a failed start or test."""
        parts = [self.control_plane.describe_failure()] if self.control_plane is not None else []
        for component in self._components:
            code = component.exited()
            state = "running" if code is None else f"exited with {code}"
            parts.append(
                f"--- {component.name} ({state}), {component.log_path}:\n{log_tail(component.log_path)}"
            )
        return "\n".join(parts)

    # -- images -----------------------------------------------------------------------------------------

    def import_images(self, paths: Iterable[Path]) -> list[str]:
        """Import image tarballs (`docker save` or OCI layout) into the node's containerd, where the kubelet
        finds them (pods must not need a pull: `imagePullPolicy: IfNotPresent` or `Never`). Returns the
        image names. A tarball whose contents the image store already holds is not imported again."""
        assert self.tools is not None
        assert self._image_store is not None, "containerd is not started"
        names: list[str] = []
        present = set(self._ctr("images", "list", "--quiet").split())
        for path in paths:
            known = self._image_store.imported_names(path, present=present)
            if known is not None:
                logger.info("%s already imported (%s)", path, ", ".join(known))
                names += known
                continue
            started = time.monotonic()
            with self._previous_build_pinned(self._image_store.previous_names(path) & present):
                imported = self._ctr_import(path)
            self._image_store.record_import(path, imported)
            names += imported
            logger.info("imported %s in %.1f s", path, time.monotonic() - started)
        self.remove_untagged_images()
        return names

    @contextlib.contextmanager
    def _previous_build_pinned(self, names: set[str]) -> Iterator[None]:
        """Keep the images that `names` point at now referenced while a new build of them is imported.

        The import moves each name to the new build before unpacking it, which leaves the previous build
        unreferenced; containerd's garbage collector may then delete the snapshots of the layers both builds
        share while the unpack relies on them ("parent snapshot ... does not exist"). A second name on the
        previous build holds them until the unpack is done."""
        pins = {name: pin_name(name) for name in names}
        for name, pin in pins.items():
            self._ctr("images", "tag", "--force", name, pin)
        try:
            yield
        finally:
            if pins:
                with contextlib.suppress(NodeClusterError):
                    self._ctr("images", "rm", *pins.values())

    def _ctr_import(self, path: Path) -> list[str]:
        """`ctr images import` of one tarball; the image names it unpacked. A failure that containerd's
        garbage collector can cause (a parent snapshot gone mid-unpack) is retried once, since the layer is
        then unpacked again from the content store; any other failure, or a second one, raises."""
        argv = self._ctr_argv("images", "import", f"--snapshotter={self._snapshotter}", str(path))
        for attempt in (1, 2):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode == 0:
                return re.findall(r"unpacking (\S+) \(sha256:", done.stdout)
            message = done.stderr.strip() or done.stdout
            if attempt == 1 and "does not exist: not found" in message:
                logger.warning("ctr images import %s: %s; importing it again", path, message)
                continue
            raise NodeClusterError(f"ctr images import {path} failed: {message}")
        raise AssertionError("unreachable")

    def remove_untagged_images(self) -> list[str]:
        """Remove the images no name points at any more (the previous build of a re-imported tag): the CRI
        keeps each one by its ID, and with image garbage collection off they would fill the disk. Returns
        the IDs removed."""
        listing = self._crictl_or_warn("images", "--output=json", timeout=120)
        if listing.returncode != 0:
            return []
        untagged = [
            image["id"] for image in json.loads(listing.stdout)["images"] if not image.get("repoTags")
        ]
        for image_id in untagged:
            self._crictl_or_warn("rmi", image_id, timeout=300)
        if untagged:
            logger.info("removed %d untagged images", len(untagged))
        return untagged

    def _ctr_argv(self, *args: str) -> list[str]:
        """`ctr` against the node's containerd, in the namespace the kubelet uses, with `args`."""
        return [
            str(self._tools.ctr),
            f"--address={self.containerd_socket}",
            f"--namespace={CONTAINERD_NAMESPACE}",
            *args,
        ]

    def _ctr(self, *args: str) -> str:
        done = subprocess.run(
            self._ctr_argv(*args),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise NodeClusterError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    # -- components -------------------------------------------------------------------------------------

    def _launch(self, name: str, argv: Sequence[str]) -> Component:
        assert self.link is not None
        component = Component(
            name=name,
            argv=[*self.link.nsenter(), *argv],
            log_path=self._work / f"{name}.log",
            env={**os.environ, "PATH": f"{SYSTEM_PATH}:{os.environ.get('PATH', '')}"},
        )
        self._components.append(component)
        component.start()
        return component

    def _wait_until(self, component: Component, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout_seconds
        while time.monotonic() < deadline:
            code = component.exited()
            if code is not None:
                raise NodeClusterError(
                    f"{component.name} exited with {code} before {what}:\n{self.describe_failure()}"
                )
            if check():
                return
            time.sleep(0.25)
        raise NodeClusterError(
            f"{what} not ready after {self.start_timeout_seconds:.0f}s:\n{self.describe_failure()}"
        )

    def _overlay_works(self, directory: Path) -> bool:
        """Whether an overlay mount works on `directory`'s filesystem (containerd's overlayfs snapshotter)."""
        probe = directory / "overlay-probe"
        lower, upper, work, merged = (probe / part for part in ("lower", "upper", "work", "merged"))
        for path in (lower, upper, work, merged):
            path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={lower},upperdir={upper},workdir={work}",
                str(merged),
            ],
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            hoststate.unmount_all_under(merged)
        shutil.rmtree(probe, ignore_errors=True)
        return done.returncode == 0

    def _start_containerd(self) -> None:
        self._image_store = ImageStore.acquire(
            shared_root=self.env_file.parent / "containerd" if self.cache_images else None,
            own_root=self.run_dir / "containerd-root",
        )
        root = self._image_store.root
        state = self.run_dir / "containerd-state"
        cni_conf_dir = self._work / "cni" / "net.d"
        for directory in (state, cni_conf_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._snapshotter = "overlayfs" if self._overlay_works(root) else "native"
        (cni_conf_dir / "10-asyncrl.conflist").write_text(
            nodeconfig.cni_conflist(network=self.network, ipam_dir=self._work / "cni" / "ipam")
        )
        config = self._work / "containerd.toml"
        config.write_text(
            nodeconfig.containerd_config(
                root=root,
                state=state,
                socket=self.containerd_socket,
                pause_image=self._tools.pause_image,
                snapshotter=self._snapshotter,
                cni_bin_dir=self._tools.cni_bin_dir,
                cni_conf_dir=cni_conf_dir,
            )
        )
        containerd = self._launch("containerd", [str(self._tools.containerd), f"--config={config}"])
        self._wait_until(containerd, "containerd's CRI", self._cri_answers)
        if self._image_store.persistent:
            self._remove_all_pods()  # what a node killed mid-run left in the shared store

    def _cri_answers(self) -> bool:
        if not self.containerd_socket.exists():
            return False
        done = subprocess.run([*self.crictl(), "info"], capture_output=True, timeout=30, check=False)
        return done.returncode == 0

    def _start_control_plane(self) -> None:
        assert self.link is not None
        self._client_pki = pki = nodeconfig.write_client_pki(self._work / "pki-node")
        self.control_plane = ControlPlane(
            bin_dir=self._tools.k8s_bin_dir,
            work_dir=self._work / "control-plane",
            start_timeout_seconds=self.start_timeout_seconds,
            controllers=NODE_CONTROLLERS,
            address=self.link.node_address,
            command_prefix=self.link.nsenter(),
            service_account_tokens=True,
            apiserver_args=(
                f"--kubelet-client-certificate={pki.cert_file}",
                f"--kubelet-client-key={pki.key_file}",
                "--kubelet-preferred-address-types=InternalIP",
            ),
        )
        try:
            self.control_plane.start()
        except ControlPlaneError as error:
            raise NodeClusterError(str(error)) from error
        self.kubeconfig = self.control_plane.kubeconfig
        self.server = self.control_plane.server

    def _start_scheduler(self) -> None:
        port = free_port()
        scheduler = self._launch(
            "kube-scheduler",
            [
                str(self._tools.k8s_bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--bind-address={self.node_address}",
                f"--secure-port={port}",
                f"--cert-dir={self._work / 'pki-scheduler'}",
                "--v=1",
            ],
        )
        url = f"https://{self.node_address}:{port}/healthz"
        self._wait_until(
            scheduler, "kube-scheduler /healthz", lambda: _http_status(url, token=self.token) == 200
        )

    def _start_kubelet(self) -> None:
        assert self._client_pki is not None
        resolv_conf = self._work / "resolv.conf"
        resolv_conf.write_text(f"nameserver {self.network.dns_service_ip}\n")
        config = self._work / "kubelet.yaml"
        config.write_text(
            nodeconfig.kubelet_config(
                network=self.network,
                runtime_socket=self.containerd_socket,
                client_ca_file=self._client_pki.ca_file,
                cgroup_root=f"/{self.node_name}",
                pod_logs_dir=self._work / "pod-logs",
                resolv_conf=resolv_conf,
            )
        )
        kubelet = self._launch(
            "kubelet",
            [
                str(self._tools.k8s_bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self._work / 'pki-kubelet'}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.node_address}",
                "--v=1",
            ],
        )
        self._wait_until(kubelet, f"node {self.node_name} Ready", self._node_ready)

    def api_get(self, path: str) -> dict[str, Any] | None:
        """GET `path` from the API server as admin; None on any error (for readiness checks)."""
        assert self.control_plane is not None
        request = urllib.request.Request(f"{self.server}{path}")
        request.add_header("Authorization", f"Bearer {self.token}")
        context = ssl.create_default_context(cafile=str(self.control_plane.ca_file))
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                found: dict[str, Any] = json.load(response)
                return found
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _node_ready(self) -> bool:
        node = self.api_get(f"/api/v1/nodes/{self.node_name}")
        conditions = (node or {}).get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _start_kube_proxy(self) -> None:
        config = self._work / "kube-proxy.yaml"
        config.write_text(nodeconfig.kube_proxy_config(network=self.network, kubeconfig=self.kubeconfig))
        proxy = self._launch(
            "kube-proxy", [str(self._tools.k8s_bin_dir / "kube-proxy"), f"--config={config}", "--v=1"]
        )
        url = f"http://{self.node_address}:{nodeconfig.KUBE_PROXY_HEALTHZ_PORT}/healthz"
        self._wait_until(proxy, "kube-proxy /healthz", lambda: _http_status(url) == 200)

    def _start_coredns(self) -> None:
        config = self._work / "Corefile"
        config.write_text(nodeconfig.corefile(network=self.network, kubeconfig=self.kubeconfig))
        coredns = self._launch("coredns", [str(self._tools.coredns), f"-conf={config}"])
        url = f"http://{self.node_address}:{nodeconfig.COREDNS_READY_PORT}/ready"
        self._wait_until(coredns, "CoreDNS /ready", lambda: _http_status(url) == 200)
        manifests = {
            "apiVersion": "v1",
            "kind": "List",
            "items": nodeconfig.dns_service_manifests(self.network),
        }
        done = subprocess.run(
            [*self.kubectl(), "apply", "-f", "-"],
            input=json.dumps(manifests),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise NodeClusterError(f"creating the kube-dns Service failed: {done.stderr.strip()}")
        # kube-proxy programs the new Service a moment later; until then pods' lookups are refused.
        self._wait_until(coredns, "DNS through the kube-dns Service", self._service_dns_answers)

    def _service_dns_answers(self) -> bool:
        assert self.link is not None
        done = subprocess.run(
            [
                *self.link.nsenter(),
                "busybox",
                "nslookup",
                f"kubernetes.default.svc.{self.network.cluster_domain}",
                self.network.dns_service_ip,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0 and self.network.api_service_ip in done.stdout

    def _wait_for_service_accounts(self) -> None:
        """Pods in `default` are admitted once its ServiceAccount exists, and start once the CA ConfigMap
        their token volume projects exists."""
        assert self.control_plane is not None
        controller_manager = self.control_plane.component("kube-controller-manager")
        self._wait_until(
            controller_manager,
            "the default ServiceAccount and kube-root-ca.crt",
            lambda: (
                self.api_get("/api/v1/namespaces/default/serviceaccounts/default") is not None
                and self.api_get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt") is not None
            ),
        )


# --- python -m asyncrl.testing.node up ---------------------------------------------------------------------


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asyncrl.testing.node",
        description="A local Kubernetes cluster with a real node (containerd), for trying the cluster path.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a cluster, print its KUBECONFIG, stop it on Ctrl-C or SIGTERM")
    up.add_argument(
        "--image", type=Path, action="append", default=[], help="an image tarball to import (repeat)"
    )
    up.add_argument("--work-dir", type=Path, default=None, help="kept after stop (default: a temporary one)")
    commands.add_parser("clean", help="remove nodes left by processes that are gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "clean":
        removed = sweep_stale_nodes(older_than_seconds=0)
        print("removed: " + (", ".join(removed) if removed else "nothing"))
        return 0
    # While starting, SIGTERM interrupts like Ctrl-C (start() stops what it began); once up, either one ends
    # the wait below.
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = NodeCluster(work_dir=args.work_dir, images=tuple(args.image))
    try:
        cluster.start()
    except NodeClusterError as error:
        print(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        return 130
    stop_requested = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_requested.set())
    try:
        assert cluster.tools is not None
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        print(f"# API server {cluster.server}, node {cluster.node_name} ({cluster.node_address})", flush=True)
        print(
            f"# images: import more with ctr --address={cluster.containerd_socket} -n k8s.io images import",
            flush=True,
        )
        print(f"# kubectl: {cluster.tools.k8s_bin_dir / 'kubectl'}; Ctrl-C stops the cluster", flush=True)
        stop_requested.wait()
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
