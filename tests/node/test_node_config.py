"""The node's configuration files and images, checked without root or a node: what each component is told."""

from __future__ import annotations

import ipaddress
import json
import tarfile
from pathlib import Path

from asyncrl.testing import netns, nodeconfig
from asyncrl.testing.imagestore import PIN_SUFFIX, pin_name
from asyncrl.testing.ociimage import ImageConfig, archive_tags, write_image_archive

NETWORK = nodeconfig.NodeNetwork(node_name="asyncrl-abc123", node_address="10.250.7.2")


def test_containerd_keeps_its_state_and_pod_namespaces_in_its_own_directories(tmp_path: Path) -> None:
    text = nodeconfig.containerd_config(
        root=tmp_path / "root",
        state=tmp_path / "state",
        socket=tmp_path / "c.sock",
        pause_image="asyncrl.local/pause:3.10",
        snapshotter="overlayfs",
        cni_bin_dir=Path("/usr/lib/cni"),
        cni_conf_dir=tmp_path / "net.d",
    )
    assert "restrict_oom_score_adj = true" in text
    assert "netns_mounts_under_state_dir = true" in text
    assert f'Root = "{tmp_path / "state" / "runc"}"' in text
    assert 'sandbox_image = "asyncrl.local/pause:3.10"' in text


def test_the_pod_network_never_masquerades_off_the_namespace(tmp_path: Path) -> None:
    conflist = json.loads(nodeconfig.cni_conflist(network=NETWORK, ipam_dir=tmp_path))
    bridge = conflist["plugins"][0]
    assert bridge["ipMasq"] is False
    assert bridge["hairpinMode"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.0.0/24", "gateway": "10.244.0.1"}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path)


def test_the_kubelet_accepts_only_client_certificates_and_keeps_every_image(tmp_path: Path) -> None:
    config = json.loads(
        nodeconfig.kubelet_config(
            network=NETWORK,
            runtime_socket=tmp_path / "c.sock",
            client_ca_file=tmp_path / "ca.crt",
            cgroup_root="/asyncrl-abc123",
            pod_logs_dir=tmp_path / "logs",
            resolv_conf=tmp_path / "resolv.conf",
        )
    )
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["clusterDNS"] == ["10.96.0.10"]


def test_kube_dns_points_at_the_node_coredns(tmp_path: Path) -> None:
    service, endpoint_slice = nodeconfig.dns_service_manifests(NETWORK)
    assert service["spec"]["clusterIP"] == "10.96.0.10"
    assert "selector" not in service["spec"]
    assert endpoint_slice["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert endpoint_slice["endpoints"][0]["addresses"] == ["10.250.7.2"]
    assert "bind 10.250.7.2" in nodeconfig.corefile(network=NETWORK, kubeconfig=tmp_path / "kubeconfig")


def test_a_picked_subnet_overlaps_nothing_in_use() -> None:
    used = [ipaddress.IPv4Network("10.250.0.0/17")]
    for _ in range(50):
        picked = netns.pick_subnet(used)
        assert picked.prefixlen == 30
        assert picked.subnet_of(netns.ADDRESS_POOL)
        assert not picked.overlaps(used[0])


def test_an_image_archive_is_reproducible_and_names_its_tag(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "tool").write_text("#!/bin/sh\n")
    config = ImageConfig(entrypoint=("/bin/tool",))
    first = write_image_archive(
        rootfs=rootfs, name="asyncrl.local/t:1", output=tmp_path / "a.tar", config=config
    )
    second = write_image_archive(
        rootfs=rootfs, name="asyncrl.local/t:1", output=tmp_path / "b.tar", config=config
    )
    assert first == second
    assert archive_tags(tmp_path / "a.tar") == ["asyncrl.local/t:1"]
    with tarfile.open(tmp_path / "a.tar") as archive:
        (entry,) = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        with tarfile.open(fileobj=archive.extractfile(entry["Layers"][0])) as layer:
            assert sorted(layer.getnames()) == ["bin", "bin/tool"]
            assert all(member.uid == 0 and member.mtime == 0 for member in layer.getmembers())


def test_a_pin_name_keeps_the_repository_and_never_is_a_build_tag() -> None:
    assert pin_name("localhost/asyncrl/trainer-cpu:dev") == "localhost/asyncrl/trainer-cpu:dev-" + PIN_SUFFIX
    assert pin_name("registry:5000/team/op") == "registry:5000/team/op:latest-" + PIN_SUFFIX
    assert pin_name("asyncrl.local/x@sha256:" + "0" * 64) == "asyncrl.local/x:" + PIN_SUFFIX
