"""A real Kubernetes control plane on 127.0.0.1, started from binaries in the local cache.

Tests of an operator prove little against a mocked API, and there is no container runtime here for kind. So,
as controller-runtime's envtest does, this module runs the real etcd, kube-apiserver and
kube-controller-manager as local processes on free loopback ports in a temporary directory. Admission, CEL
validation, the Job controller, owner garbage collection and TTL cleanup are therefore the real ones.
There is no kubelet: `asyncrl.testing.podrunner` plays that part. `asyncrl.testing.node` starts the same
control plane on another address, inside a network namespace, with a real kubelet beside it; the fields
`address`, `command_prefix`, `service_account_tokens` and `apiserver_args` are for it.

The binaries come from `scripts/provision-k8s.sh`, which builds them into
`~/.cache/asyncrl/k8s/<version>/bin`.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from asyncrl.launch.processes import free_port, stop_process_group

logger = logging.getLogger(__name__)

DEFAULT_K8S_VERSION = "1.36.3"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
# The controllers our operator relies on; everything else (scheduler, kubelet, node lifecycle) is absent.
CONTROLLERS = (
    "job-controller",
    "deployment-controller",  # agents.mode Pool: the agent pool Deployment
    "replicaset-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "resourcequota-controller",  # quota usage: without it a namespace's ResourceQuota refuses nothing
)
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
PROVISION_HINT = "run scripts/provision-k8s.sh (or set ASYNCRL_K8S_BIN_DIR to a folder holding them)"


class ControlPlaneError(RuntimeError):
    """The control plane could not be provisioned or started; the message says which part and why."""


def cache_root() -> Path:
    """The cache every scripts/provision-*.sh writes to (`ASYNCRL_CACHE_DIR`, default ~/.cache/asyncrl)."""
    return Path(os.environ.get("ASYNCRL_CACHE_DIR", Path.home() / ".cache" / "asyncrl"))


def images_dir() -> Path:
    """Where `scripts/provision-images.sh` saves the project's image tarballs."""
    return cache_root() / "images"


def default_bin_dir() -> Path:
    """Where `scripts/provision-k8s.sh` puts the binaries, honouring the same environment variables."""
    explicit = os.environ.get("ASYNCRL_K8S_BIN_DIR")
    if explicit:
        return Path(explicit)
    cache = cache_root()
    version = os.environ.get("ASYNCRL_K8S_VERSION", DEFAULT_K8S_VERSION).removeprefix("v")
    return cache / "k8s" / f"v{version}" / "bin"


def missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, or "(no log)"."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _write_service_account_key(path: Path) -> None:
    # Imported here so that modules which only need the paths do not need the dev extra.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


@dataclass
class Component:
    """One long-lived process of a cluster: its argv, its log file, and stopping its whole process group."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    env: Mapping[str, str] | None = None  # None: this process's environment

    def start(self) -> None:
        log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if self.env is None else dict(self.env),
                start_new_session=True,
            )
        finally:
            log.close()

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace_seconds: float = 10.0) -> None:
        if self.process is not None:
            stop_process_group(self.process, grace_seconds=grace_seconds, kill_wait_seconds=grace_seconds)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on loopback; use as a context manager.

    After `start()`, `kubeconfig` is a file with an admin identity (a static token in `system:masters`),
    `server` the API URL and `token` the bearer token.
    """

    bin_dir: Path = field(default_factory=default_bin_dir)
    work_dir: Path | None = None
    start_timeout_seconds: float = 120.0
    controllers: tuple[str, ...] = CONTROLLERS
    controller_manager_args: tuple[str, ...] = ()  # extra flags (a benchmark's --kube-api-qps)
    # Where every component listens and the API server advertises itself (the `kubernetes` Service endpoint).
    address: str = "127.0.0.1"
    # Put before each component's argv, e.g. `nsenter --net=/run/netns/NAME --` to run it in a namespace.
    command_prefix: tuple[str, ...] = ()
    # With a kubelet: the ServiceAccount admission plugin stays on (pods get a projected token volume) and the
    # controller-manager gets the CA it publishes as kube-root-ca.crt and the key of legacy token Secrets.
    service_account_tokens: bool = False
    apiserver_args: tuple[str, ...] = ()  # extra kube-apiserver flags (the kubelet client certificate)
    server: str = ""
    token: str = ""
    kubeconfig: Path = Path()
    _components: list[Component] = field(default_factory=list)
    _owns_work_dir: bool = False

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pki_dir(self) -> Path:
        """The API server's certificates (`apiserver.crt` is self-signed by a CA it bundles) and the
        service-account key."""
        assert self.work_dir is not None
        return self.work_dir / "pki"

    @property
    def ca_file(self) -> Path:
        """A bundle that verifies the API server's serving certificate (the kubeconfig's CA)."""
        return self.pki_dir / "apiserver.crt"

    def component(self, name: str) -> Component:
        """The running component `name` (etcd, kube-apiserver, kube-controller-manager)."""
        return next(component for component in self._components if component.name == name)

    @property
    def log_paths(self) -> dict[str, Path]:
        return {component.name: component.log_path for component in self._components}

    def start(self) -> None:
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(f"missing {', '.join(missing)} in {self.bin_dir}: {PROVISION_HINT}")
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="asyncrl-k8s-"))
            self._owns_work_dir = True
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        logger.info("control plane ready at %s (work dir %s)", self.server, self.work_dir)

    def stop(self) -> None:
        for component in reversed(self._components):
            component.stop()
        if (
            self._owns_work_dir
            and self.work_dir is not None
            and not os.environ.get("ASYNCRL_KEEP_CONTROL_PLANE")
        ):
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def describe_failure(self) -> str:
        """The tail of each component's log, for a failed start or a failing test."""
        parts = []
        for component in self._components:
            code = component.exited()
            state = "running" if code is None else f"exited with {code}"
            parts.append(
                f"--- {component.name} ({state}), {component.log_path}:\n{log_tail(component.log_path)}"
            )
        return "\n".join(parts)

    # -- components ---------------------------------------------------------------------------------------

    def _launch(self, name: str, argv: list[str]) -> Component:
        assert self.work_dir is not None
        component = Component(
            name=name, argv=[*self.command_prefix, *argv], log_path=self.work_dir / f"{name}.log"
        )
        self._components.append(component)
        component.start()
        return component

    def _start_etcd(self) -> None:
        assert self.work_dir is not None
        client_url = f"http://{self.address}:{free_port()}"
        peer_url = f"http://{self.address}:{free_port()}"
        etcd = self._launch(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._etcd_url = client_url
        self._wait_until(etcd, "etcd /health", lambda: self._http_ok(f"{client_url}/health"))

    def _start_apiserver(self) -> None:
        assert self.work_dir is not None
        cert_dir = self.pki_dir
        cert_dir.mkdir(exist_ok=True)
        sa_key = cert_dir / "service-account.key"
        _write_service_account_key(sa_key)
        self.token = secrets.token_hex(24)
        tokens = cert_dir / "tokens.csv"
        tokens.write_text(f'{self.token},asyncrl-admin,asyncrl-admin,"system:masters"\n')
        tokens.chmod(0o600)
        port = free_port()
        self.server = f"https://{self.address}:{port}"
        apiserver = self._launch(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self._etcd_url}",
                f"--cert-dir={cert_dir}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={port}",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-account-issuer={self.server}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                # Without a kubelet to mount service-account tokens the admission plugin that adds the token
                # volume is off; tests that need an identity request a token explicitly.
                *(() if self.service_account_tokens else ("--disable-admission-plugins=ServiceAccount",)),
                "--enable-priority-and-fairness=false",
                "--storage-backend=etcd3",
                "--v=1",
                *self.apiserver_args,
            ],
        )
        self._wait_until(apiserver, "kube-apiserver /readyz", lambda: self._http_ok(f"{self.server}/readyz"))

    def _write_kubeconfig(self) -> None:
        assert self.work_dir is not None
        ca = self.ca_file
        self.kubeconfig = self.work_dir / "kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            f"- name: local\n  cluster:\n    server: {self.server}\n    certificate-authority: {ca}\n"
            "users:\n"
            f"- name: admin\n  user:\n    token: {self.token}\n"
            "contexts:\n"
            "- name: local\n  context:\n    cluster: local\n    user: admin\n    namespace: default\n"
            "current-context: local\n"
        )
        self.kubeconfig.chmod(0o600)

    def _start_controller_manager(self) -> None:
        assert self.work_dir is not None
        port = free_port()
        manager = self._launch(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false",
                f"--bind-address={self.address}",
                f"--secure-port={port}",
                f"--cert-dir={self.work_dir / 'pki-controller-manager'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--concurrent-job-syncs=10",
                "--concurrent-gc-syncs=10",
                "--v=1",
                *(
                    (
                        f"--root-ca-file={self.ca_file}",
                        f"--service-account-private-key-file={self.pki_dir / 'service-account.key'}",
                    )
                    if self.service_account_tokens
                    else ()
                ),
                *self.controller_manager_args,
            ],
        )
        self._wait_until(
            manager,
            "kube-controller-manager /healthz",
            lambda: self._http_ok(f"https://{self.address}:{port}/healthz"),
        )

    # -- helpers ------------------------------------------------------------------------------------------

    def _http_ok(self, url: str) -> bool:
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        context = ssl.create_default_context()
        # Readiness only: the serving certificates are generated at start and checked by the kubeconfig CA.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_until(self, component: Component, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout_seconds
        while time.monotonic() < deadline:
            code = component.exited()
            if code is not None:
                raise ControlPlaneError(
                    f"{component.name} exited with {code} before {what}:\n{self.describe_failure()}"
                )
            if check():
                return
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{what} not ready after {self.start_timeout_seconds:.0f}s:\n{self.describe_failure()}"
        )
