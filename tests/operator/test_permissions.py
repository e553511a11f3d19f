"""The permissions review (operator/permissions.py) and what readiness answers, without a cluster; the real
API server's answers are in tests/operator/test_rbac.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asyncrl.operator.health import Readiness
from asyncrl.operator.permissions import REQUIRED, Missing, Permission, describe, missing_permissions

RBAC = Path(__file__).resolve().parents[2] / "operator" / "rbac"


def _granted(rules: list[dict[str, list[str]]], permission: Permission) -> bool:
    resource = (
        f"{permission.resource}/{permission.subresource}" if permission.subresource else permission.resource
    )
    return any(
        permission.group in rule["apiGroups"]
        and resource in rule["resources"]
        and permission.verb in rule["verbs"]
        for rule in rules
    )


@pytest.mark.parametrize(("file_name", "kind"), [("role.yaml", "Role"), ("clusterrole.yaml", "ClusterRole")])
def test_the_operators_roles_grant_every_permission_the_review_requires(file_name: str, kind: str) -> None:
    documents = yaml.safe_load_all((RBAC / file_name).read_text())
    (role,) = [doc for doc in documents if doc and doc["kind"] == kind]
    assert [str(p) for p in REQUIRED if not _granted(role["rules"], p)] == []


def test_each_denied_permission_is_named_once_per_namespace_with_the_fix() -> None:
    denied = {("team-b", Permission("create", "batch", "jobs")), ("team-b", REQUIRED[0])}
    missing = missing_permissions(["team-a", "team-b"], lambda ns, p: (ns, p) not in denied)
    assert missing == sorted(Missing("team-b", p) for _, p in denied)
    text = describe(missing)
    assert "in namespace team-b: create jobs.batch, list asynctrainingruns.asyncrl.dev" in text
    assert "team-a" not in text
    assert "operator/rbac/role.yaml" in text
    assert "cluster-wide: " in describe(
        [Missing("", Permission("patch", "asyncrl.dev", "asynctrainingruns", "status"))]
    )
    assert "patch asynctrainingruns/status.asyncrl.dev" in describe(
        missing_permissions([""], lambda ns, p: False)
    )


def test_readiness_waits_for_the_first_review_and_then_follows_it() -> None:
    readiness = Readiness()
    assert readiness.answer()[0] == 503
    readiness.missing = [Missing("team-b", REQUIRED[0])]
    status, body = readiness.answer()
    assert status == 503
    assert body["missing"] == [{"namespace": "team-b", "permission": str(REQUIRED[0])}]
    readiness.missing = []
    assert readiness.answer() == (200, {"ready": True})
