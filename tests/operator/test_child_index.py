"""The operator's index of its children (what its label-selected watches saw) and the request labels of its
API request counter: pure logic, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.operator.kube import request_labels
from asyncrl.operator.reconciliation.child_index import ChildIndex


def _object(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}}


def test_nothing_is_known_before_a_watch_listed_the_namespace() -> None:
    index = ChildIndex()
    index.apply("Service", "ADDED", _object("ns", "a"))  # an event alone says nothing about the rest
    assert index.exists("Service", "ns", "a") is None
    index.listed("Service", "ns", [_object("ns", "a")])
    assert index.exists("Service", "ns", "a") is True
    assert index.exists("Service", "ns", "b") is False
    assert index.exists("Service", "other", "a") is None  # another namespace is not listed
    assert index.exists("ConfigMap", "ns", "a") is None  # nor another kind


def test_events_add_and_remove_names() -> None:
    index = ChildIndex()
    index.listed("ConfigMap", "ns", [])
    index.apply("ConfigMap", "ADDED", _object("ns", "c"))
    assert index.exists("ConfigMap", "ns", "c") is True
    index.apply("ConfigMap", "MODIFIED", _object("ns", "c"))
    assert index.exists("ConfigMap", "ns", "c") is True
    index.apply("ConfigMap", "DELETED", _object("ns", "c"))
    assert index.exists("ConfigMap", "ns", "c") is False


def test_a_relist_forgets_what_was_deleted_while_the_watch_was_down() -> None:
    index = ChildIndex()
    index.listed("Job", "ns", [_object("ns", "trainer"), _object("ns", "agent")])
    index.listed("Job", "ns", [_object("ns", "agent")])  # no DELETED event came for the trainer
    assert index.exists("Job", "ns", "trainer") is False
    assert index.exists("Job", "ns", "agent") is True


def test_a_cluster_wide_listing_covers_every_namespace_and_replaces_all_of_them() -> None:
    index = ChildIndex()
    index.listed("Service", None, [_object("a", "s"), _object("b", "s")])
    assert index.exists("Service", "a", "s") is True
    assert index.exists("Service", "c", "s") is False  # listed: every namespace
    index.listed("Service", None, [_object("b", "s")])
    assert index.exists("Service", "a", "s") is False


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "https://k/api/v1/namespaces/ns/services/gw", ("get", "services")),
        ("GET", "https://k/api/v1/namespaces/ns/secrets/key", ("get", "secrets")),
        ("GET", "https://k/api/v1/namespaces/ns/configmaps?labelSelector=x%3Dy", ("list", "configmaps")),
        (
            "GET",
            "https://k/apis/batch/v1/namespaces/ns/jobs?watch=True&resourceVersion=5",
            ("watch", "batch/jobs"),
        ),
        ("GET", "https://k/apis/batch/v1/jobs?watch=true", ("watch", "batch/jobs")),
        (
            "PATCH",
            "https://k/apis/asyncrl.dev/v1alpha1/namespaces/ns/asynctrainingruns/r/status",
            ("patch", "asyncrl.dev/asynctrainingruns/status"),
        ),
        ("POST", "https://k/apis/events.k8s.io/v1/namespaces/ns/events", ("post", "events.k8s.io/events")),
        ("GET", "https://k/api/v1/namespaces/ns", ("get", "namespaces")),
        ("GET", "https://k/version", ("get", "(none)")),
    ],
)
def test_request_labels_name_verb_and_resource_as_the_api_server_does(
    method: str, url: str, expected: tuple[str, str]
) -> None:
    assert request_labels(method, url) == expected
