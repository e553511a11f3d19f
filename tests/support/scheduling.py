"""How `make pytest` shares the tests between its xdist workers: whole scopes, the longest first.

xdist's default (`--dist load`) deals out single tests, so both workers met most modules and each started
their module- and package-scoped fixtures (a control plane with KubeRay, the vLLM server, the real node with
its 6.5 GB trainer image), and the longest tests, collected last, ran at the end while the other worker
idled. Here a scope is a module, except the packages whose fixture is shared by all their modules (the real
node, the vLLM server), which are one scope each; a worker that runs low is given the scope with the most
seconds left (longest processing time first, which keeps the two workers' ends close).

The seconds are what CI measured per scope (the sum of each test's setup, call and teardown); a scope not in
the table counts one second per test. They only order the work: a stale figure costs time, never a result.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Directories whose tests share a package-scoped fixture: one scope, so that only one worker starts it.
PACKAGE_SCOPES = ("tests/node/", "tests/vllm/")

# Seconds per scope from CI's --durations=0 (2 workers, 2 cores, 2026-12-07), rounded; the scopes of 40 s or
# more. KubeRay's module is what it takes when its operator does not exit (it did in that run).
SCOPE_SECONDS: dict[str, float] = {
    "tests/node": 1230,
    "tests/vllm": 670,
    "tests/trainer/test_local_mode.py": 240,
    "tests/operator/test_reconcile_controlplane.py": 200,
    "tests/operator/test_kuberay_controlplane.py": 180,
    "tests/test_soak.py": 150,
    "tests/operator/test_restarts_controlplane.py": 140,
    "tests/operator/test_spec_edits_controlplane.py": 140,
    "tests/trainer/backends/test_cluster_preflight_on_ray.py": 130,
    "tests/test_manifest_commands.py": 120,
    "tests/test_time_to_reward.py": 120,
    "tests/operator/test_end_states_controlplane.py": 110,
    "tests/operator/test_operator_controlplane.py": 100,
    "tests/operator/test_rbac.py": 100,
    "tests/operator/test_pod_template_controlplane.py": 90,
    "tests/operator/test_templates_controlplane.py": 80,
    "tests/test_cluster_cli.py": 80,
    "tests/operator/test_two_operators_controlplane.py": 80,
    "tests/operator/test_pod_security_controlplane.py": 70,
    "tests/operator/test_child_watches_controlplane.py": 70,
    "tests/operator/test_agent_pool_controlplane.py": 70,
    "tests/gateway/test_sampling_params.py": 70,
    "tests/operator/test_kueue_controlplane.py": 70,
    "tests/gateway/test_streaming.py": 60,
    "tests/gateway/test_proxy.py": 60,
    "tests/test_validate_catches.py": 50,
    "tests/gateway/test_keep_alive.py": 50,
    "tests/charts/test_chart.py": 50,
    "tests/gateway/test_pauses.py": 40,
    "tests/gateway/test_pool_routes.py": 40,
}


def scope_of(nodeid: str) -> str:
    """The unit of work `nodeid` belongs to: its package for PACKAGE_SCOPES, else its module."""
    for package in PACKAGE_SCOPES:
        if nodeid.startswith(package):
            return package.rstrip("/")
    return nodeid.split("::", 1)[0]


def scope_seconds(scope: str, tests: int) -> float:
    return SCOPE_SECONDS.get(scope, float(tests))


class LongestScopeFirst(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduler with `scope_of` and the longest remaining scope handed out first."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        longest = max(self.workqueue, key=lambda scope: scope_seconds(scope, len(self.workqueue[scope])))
        self.workqueue.move_to_end(longest, last=False)
        super()._assign_work_unit(node)
