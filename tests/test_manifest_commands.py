"""`asyncrl validate`, `asyncrl render-agent-job` and how `asyncrl local run` refuses a bad file, run as a
user runs them: `python -m asyncrl.cli ...` in a real process, reading its stdout, stderr and exit code."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.workloads import names

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart-local.yaml"


def asyncrl(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )


def quickstart() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    return document


def write(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# -- validate ----------------------------------------------------------------------------------------------


def test_validate_passes_every_valid_example_and_names_the_invalid_one() -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    result = asyncrl("validate", *examples)
    assert result.returncode == 1, result.stdout + result.stderr
    # One line per file: valid, or its one problem; notes (a skipped GPU memory estimate) fail nothing.
    lines = [line for line in result.stdout.splitlines() if ": note: " not in line]
    assert len(lines) == len(examples)
    for example, line in zip(examples, lines, strict=True):
        if example.name == "run-invalid-async.yaml":
            assert line.startswith(f"{example}: spec.async.windowSize: windowSize (2) must be greater")
        else:
            assert line == f"{example}: valid"


def test_validate_prints_one_line_per_problem_with_did_you_mean(tmp_path: Path) -> None:
    document = quickstart()
    spec = document["spec"]
    spec["rollout"] = {"samplesPerPromt": 4}
    spec["trainBatchsize"] = spec.pop("trainBatchSize")
    spec["async"]["windowSize"] = 2
    spec["rollout"]["n"] = 4  # the old name
    path = write(tmp_path / "run.yaml", document)
    result = asyncrl("validate", path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f"{path}: spec.rollout.samplesPerPromt: unknown field; did you mean samplesPerPrompt?" in lines
    assert f"{path}: spec.trainBatchsize: unknown field; did you mean trainBatchSize?" in lines
    assert f"{path}: spec.rollout.n: renamed to spec.rollout.samplesPerPrompt (CHANGELOG.md)" in lines
    assert f"{path}: spec.trainBatchSize: Field required" in lines
    assert all(line.startswith(f"{path}: spec.") for line in lines), lines


def test_validate_renders_the_agent_template_for_the_first_row_as_the_operator_does(tmp_path: Path) -> None:
    document = quickstart()
    template = document["spec"]["agents"]["template"]["inline"]
    assert "            - name: ROW\n" in template
    document["spec"]["agents"]["template"]["inline"] = template.replace(
        "            - name: ROW\n",
        "            - name: Q\n              value: {{ question }}\n            - name: ROW\n",
    )
    broken = write(tmp_path / "broken.yaml", document)
    privileged = quickstart()
    assert "    spec:\n      containers:" in template
    privileged["spec"]["agents"]["template"]["inline"] = template.replace(
        "    spec:\n      containers:", "    spec:\n      hostNetwork: true\n      containers:"
    )
    host = write(tmp_path / "host.yaml", privileged)
    result = asyncrl("validate", broken, host)
    assert result.returncode == 1
    first, second = result.stdout.splitlines()
    assert first == (
        f"{broken}: spec.agents.template: agent template: 'question' is undefined "
        "(all 4 rows of spec.data.inline)"
    )
    assert second.startswith(f"{host}: spec.agents.template: agent template: spec.template.spec.hostNetwork")
    assert "refused by the operator's --agent-pod-policy=restricted" in second
    assert asyncrl("validate", "--agent-pod-policy=unrestricted", host).returncode == 0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "empty; expected an AsyncTrainingRun manifest"),
        ("# only a comment\n", "empty; expected an AsyncTrainingRun manifest"),
        ("- apiVersion: asyncrl.dev/v1alpha1\n", "a list at the top level; expected an AsyncTrainingRun"),
        ("just text\n", "a str at the top level"),
        ("spec:\n  a: [1\n", "line 3, column 1: not valid YAML: expected ',' or ']'"),
        ("spec:\n\tmodel: x\n", "line 2, column 1: not valid YAML: found character '\\t'"),
        ("a: 1\n---\nb: 2\n", "2 YAML documents; give one AsyncTrainingRun per file"),
    ],
)
def test_a_file_that_is_no_manifest_gets_one_line_naming_it_from_every_command(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(content)
    for command in (("validate",), ("render-agent-job",), ("local", "run")):
        result = asyncrl(*command, path)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        output = (result.stdout + result.stderr).strip()
        assert "Traceback" not in output
        assert len(output.splitlines()) == 1, output
        assert f"{path}: {expected}" in output, output


def test_a_missing_file_is_named() -> None:
    result = asyncrl("validate", "no-such-run.yaml")
    assert result.returncode == 1
    assert result.stdout.strip() == "no-such-run.yaml: cannot read it: No such file or directory"


# -- render-agent-job --------------------------------------------------------------------------------------


def test_render_agent_job_prints_the_job_the_operator_would_create_for_a_row(tmp_path: Path) -> None:
    result = asyncrl("render-agent-job", QUICKSTART, "--row", "2", "--namespace", "team-a")
    assert result.returncode == 0, result.stderr
    job = yaml.safe_load(result.stdout)
    assert list(job)[:4] == ["apiVersion", "kind", "metadata", "spec"]
    assert job["metadata"]["name"] == names.agent_job_name("quickstart", "s0-row2-r0")
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"]["asyncrl.dev/run"] == "quickstart"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "AsyncTrainingRun"
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 60)  # the operator's shaping
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    env = {entry["name"]: entry["value"] for entry in pod["containers"][0]["env"]}
    assert yaml.safe_load(env["ROW"]) == quickstart()["spec"]["data"]["inline"][2]
    assert env["AGL_OPENAI_BASE_URL"].startswith("http://quickstart-gateway.team-a.svc:8090/proxy/rollout/")
    assert set(env) == {"ROW", "AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"}


def test_render_agent_job_reads_rows_from_a_data_file_and_refuses_a_row_out_of_range(tmp_path: Path) -> None:
    import pyarrow
    import pyarrow.parquet

    rows = tmp_path / "train.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"prompt": ["p0", "p1"], "target": ["t0", "t1"]}), rows)
    document = quickstart()
    document["spec"]["data"] = {"path": str(rows)}
    path = write(tmp_path / "run.yaml", document)
    result = asyncrl("render-agent-job", path, "--row", "1")
    assert result.returncode == 0, result.stderr
    env = yaml.safe_load(result.stdout)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert yaml.safe_load(env[0]["value"]) == {"prompt": "p1", "target": "t1"}

    out_of_range = asyncrl("render-agent-job", path, "--row", "2")
    assert out_of_range.returncode == 1
    assert out_of_range.stderr.strip().endswith("--row 2 is out of range: the data has 2 rows (0 to 1)")
    assert out_of_range.stdout == ""


def test_render_agent_job_says_what_it_needs_for_a_configmap_template_and_names_template_errors(
    tmp_path: Path,
) -> None:
    document = quickstart()
    template = document["spec"]["agents"]["template"].pop("inline")
    document["spec"]["agents"]["template"]["configMapRef"] = {"name": "agent", "key": "job.yaml"}
    path = write(tmp_path / "run.yaml", document)
    result = asyncrl("render-agent-job", path)
    assert result.returncode == 1
    assert "pass that file with --template-file" in result.stderr

    template_file = tmp_path / "job.yaml"
    template_file.write_text(template)
    assert asyncrl("render-agent-job", path, "--template-file", template_file).returncode == 0
    template_file.write_text(template + "{% for %}\n")
    broken = asyncrl("render-agent-job", path, "--template-file", template_file)
    assert broken.returncode == 1
    assert f"{path}: agent template line" in broken.stderr, broken.stderr


def test_render_agent_job_with_invalid_fields_lists_each_one(tmp_path: Path) -> None:
    document = copy.deepcopy(quickstart())
    document["spec"]["trainer"]["checkpont"] = {}
    path = write(tmp_path / "run.yaml", document)
    result = asyncrl("render-agent-job", path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"asyncrl render-agent-job: {path}: spec.trainer.checkpont: unknown field; did you mean checkpoint?"
    )


@pytest.mark.controlplane
def test_the_rendered_agent_job_is_admitted_by_the_real_api_server(
    kubectl: list[str], namespace: str
) -> None:
    rendered = asyncrl("render-agent-job", QUICKSTART, "--row", "1", "--namespace", namespace)
    assert rendered.returncode == 0, rendered.stderr
    created = subprocess.run(
        [*kubectl, "create", "--dry-run=server", "-o", "name", "-f", "-"],
        input=rendered.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == f"job.batch/{names.agent_job_name('quickstart', 's0-row1-r0')}"
