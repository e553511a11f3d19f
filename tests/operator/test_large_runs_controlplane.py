"""Runs with a few hundred KiB of inline rows, applied as a user applies them, on the real control plane
with the real `asyncrl operator` (kopf) process.

The API server allows 256 KiB of annotations in all. kopf kept its diff base (the last handled spec) in an
annotation, a second copy of the rows: a 335 KB run applied with `kubectl apply --server-side`, and a 150 KB
run applied client-side (kubectl keeps its own copy too), were admitted, and then every kopf patch of the
run failed with `metadata.annotations: Too long`. The diff base now holds digests of the large fields
(operator/diffbase.py); `asyncrl validate` states the client-side limit (tests/test_validate_catches.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncrl.manifest.size_limits import MAX_ANNOTATION_BYTES, client_side_apply_problem
from asyncrl.testing.waiting import wait_for
from tests.operator.conftest import OperatorStarter
from tests.support.kube import kubectl_run, run_manifest, run_object

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

DIFF_BASE = "asyncrl.dev/last-handled-configuration"


def rows_of(total_bytes: int) -> list[dict[str, str]]:
    return [{"question": f"{index}:" + "x" * 1000} for index in range(total_bytes // 1024)]


def annotation_bytes(obj: dict[str, Any]) -> int:
    annotations = obj["metadata"].get("annotations") or {}
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())


def test_large_inline_rows_are_handled_server_side_and_client_side(
    api_client: Any, kubectl: list[str], namespace: str, start_operator: OperatorStarter
) -> None:
    process = start_operator()
    server_side = run_manifest("big-server-side", data={"inline": rows_of(335 * 1024)})
    client_side = run_manifest("big-client-side", data={"inline": rows_of(150 * 1024)})
    assert client_side_apply_problem(server_side) is not None  # validate tells the user to use --server-side
    assert client_side_apply_problem(client_side) is None
    applied = kubectl_run(
        kubectl, "apply", "--server-side", "-n", namespace, "-f", "-", stdin=json.dumps(server_side)
    )
    assert applied.returncode == 0, applied.stderr
    applied = kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(client_side))
    assert applied.returncode == 0, applied.stderr

    for name in ("big-server-side", "big-client-side"):

        def handled(name: str = name) -> dict[str, Any] | None:
            obj = run_object(api_client, namespace, name)
            return obj if DIFF_BASE in (obj["metadata"].get("annotations") or {}) else None

        obj = wait_for(handled, timeout=120, what=f"kopf's diff base on {name}")
        assert len(obj["metadata"]["annotations"][DIFF_BASE]) < 16 * 1024
        assert annotation_bytes(obj) <= MAX_ANNOTATION_BYTES
    assert "Too long" not in process.log()
