"""The configuration files of the test node's components, as pure functions of its addresses and paths.

Kept apart from the code that starts processes so that what each component is told (and why) reads in one
place and is checked by fast tests without root. The choices that matter on this kind of machine:

- containerd: CRI with `restrict_oom_score_adj` (processes here may not lower their OOM score; without it
  every sandbox fails with runc's "can't get final child's PID from pipe: EOF"), the pause image made here,
  runc state and pod network namespaces under the node's own state directory, not the machine's.
- kubelet: cgroup v1 allowed, cgroupfs driver with a cgroup root of the node's own, no swap check, no node
  allocatable enforcement or local-storage isolation, no image garbage collection (an image removed here
  cannot be pulled back) and no disk-pressure eviction. Its API (logs, exec, port-forward) accepts only the
  API server's client certificate.
- kube-proxy: iptables mode, every Service connection masqueraded (so hairpin and same-bridge traffic return
  through the proxy), conntrack sysctls left alone.
- DNS: CoreDNS as a process of the node listening on the node's address, published as the usual `kube-dns`
  Service (10.96.0.10) with an EndpointSlice that points at it, so pods see the standard resolv.conf.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
KUBE_PROXY_HEALTHZ_PORT = 10256
COREDNS_READY_PORT = 8181
DNS_SERVICE_MANAGER = "asyncrl-node-harness"


@dataclass(frozen=True)
class NodeNetwork:
    """The node's name and addresses. Pod and Service ranges can be the same for every node on the machine,
    since each lives in a network namespace of its own; only `node_address` is seen by the machine."""

    node_name: str
    node_address: str
    pod_subnet: str = "10.244.0.0/24"
    cluster_cidr: str = POD_CIDR
    service_cidr: str = SERVICE_CIDR
    dns_service_ip: str = DNS_SERVICE_IP
    cluster_domain: str = CLUSTER_DOMAIN

    @property
    def pod_gateway(self) -> str:
        return str(next(ipaddress.IPv4Network(self.pod_subnet).hosts()))

    @property
    def api_service_ip(self) -> str:
        """The `kubernetes` Service's address (the API server gives it the range's first)."""
        return str(next(ipaddress.IPv4Network(self.service_cidr).hosts()))


def _toml_string(value: str | Path) -> str:
    return json.dumps(str(value))  # a TOML basic string has JSON's escapes


def containerd_config(
    *,
    root: Path,
    state: Path,
    socket: Path,
    pause_image: str,
    snapshotter: str,
    cni_bin_dir: Path,
    cni_conf_dir: Path,
) -> str:
    """containerd 1.6's config (version 2): its own root, state and socket; CRI on."""
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    runc = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]'
    return "\n".join(
        [
            "version = 2",
            f"root = {_toml_string(root)}",
            f"state = {_toml_string(state)}",
            "disabled_plugins = ["
            '"io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", '
            '"io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]',
            "",
            "[grpc]",
            f"  address = {_toml_string(socket)}",
            "[ttrpc]",
            f"  address = {_toml_string(str(socket) + '.ttrpc')}",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_toml_string(root / 'opt')}",
            cri,
            f"  sandbox_image = {_toml_string(pause_image)}",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "  enable_selinux = false",
            "  max_container_log_line_size = 16384",
            f"{cri[:-1]}.containerd]",
            f"  snapshotter = {_toml_string(snapshotter)}",
            '  default_runtime_name = "runc"',
            "  discard_unpacked_layers = false",
            runc,
            '  runtime_type = "io.containerd.runc.v2"',
            f"{runc[:-1]}.options]",
            "  SystemdCgroup = false",
            f"  Root = {_toml_string(state / 'runc')}",
            f"{cri[:-1]}.cni]",
            f"  bin_dir = {_toml_string(cni_bin_dir)}",
            f"  conf_dir = {_toml_string(cni_conf_dir)}",
            "  max_conf_num = 1",
            "",
        ]
    )


def cni_conflist(*, network: NodeNetwork, ipam_dir: Path) -> str:
    """bridge (gateway for the pods, hairpin on, no masquerade: nothing leaves the namespace) with
    host-local addresses from the node's /24, then portmap for hostPort. containerd adds the loopback
    plugin for each pod itself."""
    document = {
        "cniVersion": "0.4.0",
        "name": "asyncrl",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": network.pod_subnet, "gateway": network.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def kubelet_config(
    *,
    network: NodeNetwork,
    runtime_socket: Path,
    client_ca_file: Path,
    cgroup_root: str,
    pod_logs_dir: Path,
    resolv_conf: Path,
) -> str:
    """KubeletConfiguration (JSON is YAML) for this machine: see the module docstring."""
    document: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": network.node_address,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": network.node_address,
        "healthzPort": 10248,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "clusterDNS": [network.dns_service_ip],
        "clusterDomain": network.cluster_domain,
        "resolvConf": str(resolv_conf),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podLogsDir": str(pod_logs_dir),
        "serializeImagePulls": False,
        "maxPods": 110,
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
    }
    return json.dumps(document, indent=2) + "\n"


def kube_proxy_config(*, network: NodeNetwork, kubeconfig: Path) -> str:
    """KubeProxyConfiguration: iptables mode, masquerade all Service traffic, touch no global sysctl."""
    document = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": network.node_name,
        "bindAddress": network.node_address,
        "healthzBindAddress": f"{network.node_address}:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": network.cluster_cidr,
        "iptables": {"masqueradeAll": True, "minSyncPeriod": "0s", "syncPeriod": "30s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "nodePortAddresses": [f"{network.node_address}/32"],
    }
    return json.dumps(document, indent=2) + "\n"


def corefile(*, network: NodeNetwork, kubeconfig: Path) -> str:
    """CoreDNS answering for the cluster domain (and reverse lookups) from the API; nothing is forwarded
    off the machine, so any other name fails to resolve."""
    return "\n".join(
        [
            ".:53 {",
            f"    bind {network.node_address}",
            "    errors",
            f"    ready {network.node_address}:{COREDNS_READY_PORT}",
            f"    kubernetes {network.cluster_domain} in-addr.arpa ip6.arpa {{",
            f"        kubeconfig {kubeconfig}",
            "        pods insecure",
            "        fallthrough in-addr.arpa ip6.arpa",
            "        ttl 5",
            "    }",
            "    loadbalance",
            "}",
            "",
        ]
    )


def dns_service_manifests(network: NodeNetwork) -> list[dict[str, Any]]:
    """The `kube-dns` Service (no selector: its endpoint is the node's CoreDNS process) and its
    EndpointSlice, as kube-proxy reads it."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"},
        },
        "spec": {
            "clusterIP": network.dns_service_ip,
            "ports": [
                {"name": name, "protocol": protocol, "port": 53, "targetPort": 53} for name, protocol in ports
            ],
        },
    }
    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-node",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": DNS_SERVICE_MANAGER,
            },
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [network.node_address],
                "conditions": {"ready": True},
                "nodeName": network.node_name,
            }
        ],
        "ports": [{"name": name, "protocol": protocol, "port": 53} for name, protocol in ports],
    }
    return [service, endpoint_slice]


def kubeconfig_text(*, server: str, ca_file: Path, token: str) -> str:
    """A kubeconfig with one cluster and a bearer token."""
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca_file}\n"
        "users:\n"
        f"- name: admin\n  user:\n    token: {token}\n"
        "contexts:\n"
        "- name: local\n  context:\n    cluster: local\n    user: admin\n    namespace: default\n"
        "current-context: local\n"
    )


@dataclass(frozen=True)
class ClientPki:
    """A CA and a client certificate it signed (the API server's identity toward the kubelet)."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def write_client_pki(directory: Path, *, common_name: str = "kube-apiserver-kubelet-client") -> ClientPki:
    """A fresh CA and a client certificate for `common_name` (in group system:masters), valid for a week."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=7)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "asyncrl-node-client-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                ]
            )
        )
        .issuer_name(ca_name)
        .public_key(client_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = ClientPki(
        ca_file=directory / "kubelet-client-ca.crt",
        cert_file=directory / "kubelet-client.crt",
        key_file=directory / "kubelet-client.key",
    )
    pki.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(
        client_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pki.key_file.chmod(0o600)
    return pki
