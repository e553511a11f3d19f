"""`asyncrl validate` and `asyncrl render-agent-job` refuse what the operator's `restricted` policy refuses
(issue 24's gaps among them), in a real process, naming the field; `unrestricted` lets it through."""

from __future__ import annotations

from pathlib import Path

from tests.test_manifest_commands import asyncrl, quickstart, write

CONTAINERS = "    spec:\n      containers:"


def _with_template(tmp_path: Path, name: str, old: str, new: str) -> Path:
    document = quickstart()
    template = document["spec"]["agents"]["template"]["inline"]
    assert old in template
    document["spec"]["agents"]["template"]["inline"] = template.replace(old, new, 1)
    return write(tmp_path / f"{name}.yaml", document)


def test_validate_and_render_agent_job_refuse_another_runs_claim_and_a_job_selector(tmp_path: Path) -> None:
    claim = _with_template(
        tmp_path,
        "claim",
        CONTAINERS,
        "    spec:\n      volumes:\n        - name: ckpt\n"
        "          persistentVolumeClaim: {claimName: other-ckpt}\n      containers:",
    )
    selector = _with_template(
        tmp_path, "selector", "spec:\n  template:", "spec:\n  manualSelector: true\n  template:"
    )
    for command in ("validate", "render-agent-job"):
        for path, field in (
            (claim, "spec.template.spec.volumes[0].persistentVolumeClaim"),
            (selector, "spec.manualSelector"),
        ):
            result = asyncrl(command, path)
            output = result.stdout + result.stderr
            assert result.returncode == 1, (command, output)
            assert f"agent template: {field}: " in output, (command, output)
            assert "refused by the operator's --agent-pod-policy=restricted" in output, (command, output)
            assert "Traceback" not in output
            assert asyncrl(command, "--agent-pod-policy=unrestricted", path).returncode == 0, command
