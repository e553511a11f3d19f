"""Whether the operator may do its job: the permissions it needs in each namespace it watches, checked with
the API server's own authorizer (SelfSubjectAccessReview), and what readiness says when one is missing.

Without them the operator used to look healthy: with `--namespace team-b` and no Role there, every request got
403, `/healthz` said 200, no error was counted and the run stayed blank; only the operator's log knew. Now a
review every `REVIEW_SECONDS` names each missing permission on `/readyz` (503), in the log (once per change),
in `asyncrl_operator_missing_permissions` and in `asyncrl_operator_errors_total{kind="forbidden"}`.

The list is the part of operator/rbac/role.yaml without which no run can be handled at all (tests/operator
checks that the Role grants each of them); the review is SelfSubjectAccessReview, which every authenticated
identity may create (the `system:basic-user` ClusterRole).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.api.types.meta import GROUP, PLURAL

REVIEW_SECONDS = 30.0


@dataclass(frozen=True, order=True)
class Permission:
    verb: str
    group: str
    resource: str
    subresource: str = ""

    def __str__(self) -> str:
        name = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {name}.{self.group}" if self.group else f"{self.verb} {name}"


REQUIRED: tuple[Permission, ...] = (
    Permission("list", GROUP, PLURAL),
    Permission("watch", GROUP, PLURAL),
    Permission("patch", GROUP, PLURAL),
    Permission("patch", GROUP, PLURAL, "status"),
    Permission("create", "batch", "jobs"),
    Permission("watch", "batch", "jobs"),
    Permission("create", "", "configmaps"),
    Permission("create", "", "secrets"),
    Permission("create", "", "services"),
    Permission("list", "", "pods"),
    Permission("create", "events.k8s.io", "events"),
)


@dataclass(frozen=True, order=True)
class Missing:
    namespace: str  # "" for every namespace (an operator started with --all-namespaces)
    permission: Permission


def missing_permissions(
    namespaces: Sequence[str], allowed: Callable[[str, Permission], bool], also: Sequence[Missing] = ()
) -> list[Missing]:
    """Every required permission `allowed(namespace, permission)` denies, in each watched namespace, and
    those of `also` (permissions needed in one namespace each, e.g. the leader election's Lease)."""
    required = [Missing(namespace, permission) for namespace in namespaces for permission in REQUIRED]
    return sorted(
        entry for entry in dict.fromkeys([*required, *also]) if not allowed(entry.namespace, entry.permission)
    )


def describe(missing: Sequence[Missing], identity: str = "the operator's ServiceAccount") -> str:
    """One line for readiness and the log: what is missing where, and the fix."""
    by_namespace: dict[str, list[str]] = {}
    for entry in missing:
        by_namespace.setdefault(entry.namespace, []).append(str(entry.permission))
    places = "; ".join(
        f"{'cluster-wide' if not namespace else f'in namespace {namespace}'}: {', '.join(verbs)}"
        for namespace, verbs in by_namespace.items()
    )
    return (
        f"{identity} may not {places}. Bind it to the operator's Role there (operator/rbac/role.yaml, "
        "operator/rbac/leader-election.yaml for leases, or the chart's rbac; "
        "`kubectl auth can-i --as=system:serviceaccount:NS:NAME ...` shows what it may do)"
    )


def access_review_allowed(api_client: Any) -> Callable[[str, Permission], bool]:
    """`allowed(namespace, permission)` through SelfSubjectAccessReview (a blocking call). A review the API
    server refuses or cannot answer counts as denied."""
    from kubernetes import client

    authorization: Any = client.AuthorizationV1Api(api_client)

    def allowed(namespace: str, permission: Permission) -> bool:
        attributes = {
            "verb": permission.verb,
            "group": permission.group,
            "resource": permission.resource,
            "subresource": permission.subresource,
        }
        if namespace:
            attributes["namespace"] = namespace
        body = {"spec": {"resourceAttributes": attributes}}
        try:
            review = authorization.create_self_subject_access_review(body, _preload_content=False)
        except client.exceptions.ApiException:
            return False
        return bool(json.loads(review.data).get("status", {}).get("allowed"))

    return allowed


async def review(
    api_client: Any, namespaces: Sequence[str], *, also: Sequence[Missing] = ()
) -> list[Missing]:
    """The missing permissions now (the reviews run in a worker thread)."""
    allowed = access_review_allowed(api_client)
    return await asyncio.to_thread(missing_permissions, namespaces, allowed, also)
