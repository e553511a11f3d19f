"""A network namespace of the test node's own, joined to this machine by a veth pair with a private /30.

Everything the node's networking touches (the CNI bridge, kube-proxy's iptables rules, pod and Service
addresses, the API server's and kubelet's ports) lives inside this namespace, so a test cluster adds nothing
to the machine's own network but one veth, and deleting the namespace removes the bridge and every rule with
it. Nothing is routed off the machine: the namespace has no default route, only its /30 and a route of the
Service range to its loopback device, with the node's address as source (so that connections its own
processes open to a Service address get a route before kube-proxy's DNAT rewrites them; one that no Service
rule rewrites goes nowhere).

Processes are started in it with `nsenter --net=...` (not `ip netns exec`, which also makes a private mount
namespace and would hide the kubelet's tmpfs and projected-volume mounts from containerd).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
NAME_PREFIX = "asyncrl-"
ADDRESS_POOL = ipaddress.IPv4Network("10.250.0.0/16")
NODE_INTERFACE = "veth0"  # the namespace's end of the pair


class NetnsError(RuntimeError):
    """A namespace or link could not be made or removed; the message holds the command and its output."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class NodeLink:
    """The namespace `name`, its veth (`host_interface` on the machine, `veth0` inside) and the /30's ends."""

    name: str
    host_interface: str
    host_address: str
    node_address: str
    prefix_length: int = 30

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def nsenter(self) -> tuple[str, ...]:
        """argv prefix that runs a command in this network namespace (and only that namespace)."""
        return ("nsenter", f"--net={self.path}", "--")


def used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of this machine's addresses and routes (the /30 picked must overlap none)."""
    found: list[ipaddress.IPv4Network] = []
    addresses = json.loads(_run("ip", "-j", "-4", "addr", "show").stdout or "[]")
    for interface in addresses:
        for info in interface.get("addr_info", []):
            found.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    routes = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        destination = route.get("dst", "")
        if destination and destination != "default":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.IPv4Network(destination, strict=False))
    return found


def pick_subnet(
    used: Iterable[ipaddress.IPv4Network], *, pool: ipaddress.IPv4Network = ADDRESS_POOL, attempts: int = 200
) -> ipaddress.IPv4Network:
    """A random /30 of `pool` that overlaps none of `used`."""
    taken = list(used)
    count = 2 ** (30 - pool.prefixlen)
    for _ in range(attempts):
        index = secrets.randbelow(count)
        candidate = ipaddress.IPv4Network((int(pool.network_address) + 4 * index, 30))
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise NetnsError(f"no free /30 in {pool} after {attempts} tries")


def create_link(*, name: str | None = None, service_cidr: str = "10.96.0.0/16") -> NodeLink:
    """A new namespace (`asyncrl-<6 hex>` unless named) with a veth to the machine and a private /30."""
    suffix = secrets.token_hex(3)
    name = name or f"{NAME_PREFIX}{suffix}"
    subnet = pick_subnet(used_networks())
    host_address, node_address = (str(address) for address in subnet.hosts())
    link = NodeLink(
        name=name, host_interface=f"arl{name[-6:]}", host_address=host_address, node_address=node_address
    )
    _run("ip", "netns", "add", name)
    try:
        in_ns = ("ip", "-n", name)
        _run(
            "ip",
            "link",
            "add",
            link.host_interface,
            "type",
            "veth",
            "peer",
            "name",
            NODE_INTERFACE,
            "netns",
            name,
        )
        _run("ip", "addr", "add", f"{host_address}/30", "dev", link.host_interface)
        _run("ip", "link", "set", link.host_interface, "up")
        _run(*in_ns, "link", "set", "lo", "up")
        _run(*in_ns, "addr", "add", f"{node_address}/30", "dev", NODE_INTERFACE)
        _run(*in_ns, "link", "set", NODE_INTERFACE, "up")
        _run(*in_ns, "route", "add", service_cidr, "dev", "lo", "src", node_address)
        # Pods reach each other and the node through the namespace's own routing; bridged traffic passes
        # iptables (kube-proxy's Service rules) when br_netfilter is loaded.
        set_sysctl(link, "net.ipv4.ip_forward", "1")
        set_sysctl(link, "net.bridge.bridge-nf-call-iptables", "1", required=False)
        set_sysctl(link, "net.ipv6.conf.all.disable_ipv6", "1", required=False)
    except BaseException:
        delete_link(link)
        raise
    logger.info("network namespace %s: node %s, host %s", name, node_address, host_address)
    return link


def set_sysctl(link: NodeLink, key: str, value: str, *, required: bool = True) -> None:
    """Write a sysctl inside the namespace (network sysctls are per namespace)."""
    done = _run(*link.nsenter(), "sysctl", "-q", "-w", f"{key}={value}", check=False)
    if done.returncode != 0 and required:
        raise NetnsError(f"sysctl {key}={value} in {link.name}: {done.stderr.strip()}")


def delete_link(link: NodeLink) -> None:
    """Remove the namespace (its bridge, routes and iptables rules go with it) and the machine's veth end."""
    delete_namespace(link.name)
    if Path(f"/sys/class/net/{link.host_interface}").exists():
        _run("ip", "link", "del", link.host_interface, check=False)


def delete_namespace(name: str) -> None:
    if (NETNS_DIR / name).exists():
        done = _run("ip", "netns", "delete", name, check=False)
        if done.returncode != 0:
            logger.warning("ip netns delete %s: %s", name, done.stderr.strip())


def namespaces(prefix: str = NAME_PREFIX) -> dict[str, float]:
    """The named namespaces starting with `prefix`, each with its age in seconds."""
    found: dict[str, float] = {}
    if not NETNS_DIR.is_dir():
        return found
    now = time.time()
    for entry in NETNS_DIR.iterdir():
        if entry.name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                found[entry.name] = now - entry.lstat().st_mtime
    return found


def pids_in_namespace(path: Path) -> list[int]:
    """The processes whose network namespace is the one pinned at `path` (none when it is gone)."""
    try:
        target = os.stat(path)
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            namespace = os.stat(entry / "ns" / "net")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if (namespace.st_ino, namespace.st_dev) == (target.st_ino, target.st_dev):
            found.append(int(entry.name))
    return found
