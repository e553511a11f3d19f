"""`asyncrl validate` catches, before apply, the mistakes that used to pass it and fail only at run time
(issue 26, "Catch every mistake before apply"). Each bad manifest is a fixture in tests/manifests/invalid/,
checked as a user runs the command: a real `python -m asyncrl.cli validate` process, its stdout and exit code.
verl 0.9.1 is installed here (the trainer extra), so verlOverrides are checked against verl's own config."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from asyncrl.manifest.size_limits import MAX_ANNOTATION_BYTES

REPO = Path(__file__).resolve().parents[1]
INVALID = REPO / "tests" / "manifests" / "invalid"
EXAMPLES = REPO / "examples"

# fixture → the line (after "<path>: ") that validate must print for it
EXPECTED = {
    "verl-key-typo.yaml": (
        "spec.trainer.verlOverrides: 'actor_rollout_ref.actor.optim.lrr' is not a verl setting. "
        "Did you mean 'actor_rollout_ref.actor.optim.lr'?"
    ),
    "verl-adv-estimator-typo.yaml": (
        "spec.trainer.verlOverrides: 'algorithm.adv_estimator' = 'grpoo' is not one of verl's advantage "
        "estimators; did you mean 'grpo'?"
    ),
    "verl-lr-not-a-number.yaml": (
        "spec.trainer.verlOverrides: 'actor_rollout_ref.actor.optim.lr' must be a number (e.g. 1.0e-6), "
        "not 'fast'"
    ),
    "verl-top-p-biases-weights.yaml": (
        "spec.trainer.verlOverrides: actor_rollout_ref.rollout.top_p is 0.9, but training needs top_p off: "
        "vLLM reports each sampled token's log-prob after the nucleus filter, the trainer recomputes it "
        "without any filter, so every importance weight would be biased; remove "
        "actor_rollout_ref.rollout.top_p from spec.trainer.verlOverrides or set it to 1.0"
    ),
    "template-comand.yaml": (
        "spec.agents.template: agent template: spec.template.spec.containers[0].comand: unknown field; "
        "did you mean command? (all 4 rows of spec.data.inline)"
    ),
    "template-resource.yaml": (
        "spec.agents.template: agent template: spec.template.spec.containers[0].resource: unknown field; "
        "did you mean resources?"
    ),
    "row-1-numeric-answer.yaml": (
        "spec.agents.template: agent template: spec.template.spec.containers[0].env[1].value: expected a "
        "string"
    ),
    "labels-not-dns.yaml": (
        "spec.agents.template: agent template: metadata.labels.team: label value 'ml team'"
    ),
    "quantity-cpu-negative.yaml": "spec.trainer.resources.requests.cpu: '-1' is negative",
    "quantity-memory-limit-below-request.yaml": (
        "spec.agents.template: agent template: spec.template.spec.containers[0].resources.limits.memory: the "
        "limit '512Mi' is below the request '1Gi' of memory"
    ),
    "enum-wrong-case.yaml": (
        "spec.rolloutCorrection.mode: Input should be 'Token', 'Sequence' or 'Disabled'; "
        "did you mean 'Token'?"
    ),
}


def validate(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "validate", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), **(env or {})},
    )


def lines_of(result: subprocess.CompletedProcess[str], path: Path) -> list[str]:
    prefix = f"{path}: "
    return [line.removeprefix(prefix) for line in result.stdout.splitlines() if line.startswith(prefix)]


def test_every_fixture_is_kept_and_expected() -> None:
    assert sorted(path.name for path in INVALID.glob("*.yaml")) == sorted(EXPECTED)


def test_validate_refuses_each_bad_manifest_naming_the_field_and_the_fix() -> None:
    paths = [INVALID / name for name in EXPECTED]
    result = validate(*paths)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for path in paths:
        lines = lines_of(result, path)
        assert lines, f"{path.name}: no line in {result.stdout}"
        assert "valid" not in lines, (path.name, lines)
        assert any(line.startswith(EXPECTED[path.name]) for line in lines), (path.name, lines)


def test_only_the_row_that_fails_is_named() -> None:
    path = INVALID / "row-1-numeric-answer.yaml"
    (line,) = lines_of(validate(path), path)
    assert line.endswith("got the integer 7 (spec.data.inline row 1)"), line


def test_the_labels_key_is_refused_too_with_what_a_key_may_hold() -> None:
    path = INVALID / "labels-not-dns.yaml"
    lines = lines_of(validate(path), path)
    assert any(
        line.startswith(
            "spec.agents.template: agent template: metadata.labels.cost center: label key 'cost center'"
        )
        for line in lines
    ), lines


# The examples' models are Hub names or paths in the trainer pod: validate cannot read their config.json.
SKIPPED_MEMORY = "note: spec.trainer: GPU memory not estimated: "


def test_every_example_still_validates() -> None:
    examples = sorted(EXAMPLES.glob("*.yaml"))
    result = validate(*examples)
    for example in examples:
        if example.name != "run-invalid-async.yaml":
            lines = [line for line in lines_of(result, example) if not line.startswith(SKIPPED_MEMORY)]
            assert lines == ["valid"], (example.name, result.stdout, result.stderr)


def test_the_reference_backend_names_the_overrides_it_ignores(tmp_path: Path) -> None:
    document = yaml.safe_load((EXAMPLES / "quickstart-local.yaml").read_text())
    document["spec"]["trainer"]["verlOverrides"]["algorithm.adv_estimator"] = "grpo"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(document))
    result = validate(path)
    assert result.returncode == 0, result.stdout
    assert lines_of(result, path) == [
        "valid",
        "note: spec.trainer.verlOverrides: the Reference backend reads only actor_rollout_ref.actor.optim.lr "
        "and ignores algorithm.adv_estimator (they take effect with trainer.backend: Verl)",
    ]


def test_without_verl_the_overrides_are_said_to_be_unchecked_and_how_to_check_them(tmp_path: Path) -> None:
    """A Python without verl (no trainer extra): `sys.modules['verl'] = None` makes it unfindable."""
    hider = tmp_path / "hide_verl"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text("import sys\nsys.modules['verl'] = None\n")
    path = INVALID / "verl-key-typo.yaml"
    env = {"PYTHONPATH": os.pathsep.join([str(hider), str(REPO / "src"), str(REPO)])}
    result = validate(path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines_of(result, path) == [
        "valid",
        "note: spec.trainer.verlOverrides: not checked: verlOverrides were not checked against verl's config "
        "(verl not installed here); install the trainer extra (pip install 'asyncrl[trainer]') and run "
        "asyncrl validate again",
        f"{SKIPPED_MEMORY}Qwen/Qwen2.5-0.5B-Instruct/config.json is not readable here (a Hub name or a path "
        "in the trainer pod); the trainer's preflight estimates it against its GPU",
    ]
    assert importlib.util.find_spec("verl") is not None  # here, verl is installed: the other tests check


def big_inline_run(rows_bytes: int) -> dict[str, Any]:
    """examples/quickstart-local.yaml with 4 inline rows of about `rows_bytes` bytes in all (few rows: each
    row's agent Job is rendered, which takes longer than reading it)."""
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / "quickstart-local.yaml").read_text())
    row = {"prompt": "x" * (rows_bytes // 4), "target": "ab"}
    document["spec"]["data"]["inline"] = [copy.deepcopy(row) for _ in range(4)]
    return document


def test_a_335_kb_inline_dataset_is_refused_for_kubectl_apply_and_accepted_for_server_side(
    tmp_path: Path,
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(big_inline_run(335 * 1024)))
    assert path.stat().st_size > 335 * 1000
    result = validate(path)
    assert result.returncode == 1
    (line,) = lines_of(result, path)
    assert line.startswith("(whole manifest): too large for `kubectl apply`")
    assert f"over the API server's {MAX_ANNOTATION_BYTES}" in line
    assert "kubectl apply --server-side" in line
    assert "spec.data.configMapRef or spec.data.path" in line
    server_side = validate("--server-side", path)
    assert lines_of(server_side, path) == ["valid"], server_side.stdout


def test_over_a_configmap_even_server_side_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(big_inline_run(1100 * 1024)))
    result = validate("--server-side", path)
    assert result.returncode == 1
    assert lines_of(result, path)[0].startswith("spec: the run's spec and agent template take")


def test_render_agent_job_refuses_what_the_job_schema_lacks() -> None:
    for name, expected in (
        ("template-comand.yaml", "containers[0].comand: unknown field; did you mean command?"),
        ("template-resource.yaml", "containers[0].resource: unknown field; did you mean resources?"),
    ):
        path = INVALID / name
        result = subprocess.run(
            [sys.executable, "-m", "asyncrl.cli", "render-agent-job", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
        )
        assert result.returncode == 1, result.stdout
        assert result.stdout == ""  # no Job printed
        assert result.stderr.strip() == (
            f"asyncrl render-agent-job: {path}: agent template: spec.template.spec.{expected}"
        )
