"""The scopes `make pytest` hands its workers (tests/support/scheduling.py)."""

from __future__ import annotations

from tests.support.scheduling import SCOPE_SECONDS, scope_of, scope_seconds


def test_the_node_and_vllm_packages_are_one_scope_each_and_other_tests_go_by_module() -> None:
    assert scope_of("tests/node/test_cluster_quickstart.py::test_x") == "tests/node"
    assert scope_of("tests/node/test_node_smoke.py::test_y[a::b]") == "tests/node"
    assert scope_of("tests/vllm/test_gateway_against_vllm.py::test_z") == "tests/vllm"
    assert scope_of("tests/operator/test_rbac.py::test_a") == "tests/operator/test_rbac.py"
    assert scope_of("tests/gateway/test_access.py::TestX::test_b[1]") == "tests/gateway/test_access.py"


def test_measured_scopes_weigh_their_seconds_and_others_one_second_a_test() -> None:
    assert scope_seconds("tests/no_such_module.py", 7) == 7.0
    for scope, seconds in SCOPE_SECONDS.items():
        assert scope_seconds(scope, 1) == seconds
        assert scope == scope_of(f"{scope}/x.py::t") or scope.endswith(".py"), scope
