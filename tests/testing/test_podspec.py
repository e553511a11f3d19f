"""The pure container-spec rules the pod runner mirrors from Kubernetes."""

from __future__ import annotations

import pytest

from asyncrl.launch.podspec import Image, ImageTable, container_argv, expand_references, map_paths, pod_field


def test_references_to_known_variables_are_expanded_and_unknown_kept() -> None:
    assert expand_references("$(A)-$(B)-$(MISSING)", {"A": "1", "B": "2"}) == "1-2-$(MISSING)"


def test_double_dollar_escapes_a_reference() -> None:
    assert expand_references("$$(A)", {"A": "1"}) == "$(A)"


def test_command_replaces_entrypoint_and_args_follow() -> None:
    image = Image(entrypoint=("python", "-m", "agent"))
    assert container_argv(image, ["sh", "-c"], ["echo $(X)"], {"X": "hi"}) == ["sh", "-c", "echo hi"]
    assert container_argv(image, None, ["--fast"], {}) == ["python", "-m", "agent", "--fast"]


def test_a_stand_in_image_replaces_the_command_and_keeps_the_args() -> None:
    stand_in = Image(entrypoint=("python", "-m", "stub"), replace_command=True)
    assert container_argv(stand_in, ["asyncrl", "trainer"], ["--config=x"], {}) == [
        "python",
        "-m",
        "stub",
        "--config=x",
    ]


def test_container_without_command_or_entrypoint_is_an_error() -> None:
    with pytest.raises(ValueError, match="no command"):
        container_argv(Image(), None, None, {})


def test_paths_under_a_mount_are_rewritten_longest_mount_first() -> None:
    mounts = {"/etc/config": "/tmp/v/config", "/etc/config/deep": "/tmp/v/deep"}
    assert map_paths("cat /etc/config/a.yaml", mounts) == "cat /tmp/v/config/a.yaml"
    assert map_paths("--file=/etc/config/deep/x", mounts) == "--file=/tmp/v/deep/x"
    assert map_paths("/etc/configuration", mounts) == "/etc/configuration"


def test_image_table_falls_back_to_wildcard_only_when_present() -> None:
    table = ImageTable({"a": Image(entrypoint=("a",))})
    assert table.lookup("b") is None
    table["*"] = Image(entrypoint=("any",))
    assert table.lookup("b") == Image(entrypoint=("any",))


def test_field_refs_read_metadata_labels_and_defaults() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}}, "spec": {}, "status": {}}
    assert pod_field(pod, "metadata.name") == "p"
    assert pod_field(pod, "metadata.labels['app']") == "x"
    assert pod_field(pod, "status.podIP") == "127.0.0.1"
    with pytest.raises(ValueError, match="unsupported fieldRef"):
        pod_field(pod, "spec.containers[0]")
