"""Local mode end to end: gateway, trainer (reference backend) and agents as real local processes.

Nothing is stood in: the toy agent from examples/ calls the tiny reference model through the gateway, the
trainer updates it with verl's GRPO code, and metrics land in a JSON-lines file and an offline W&B run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.testing.waiting import wait_for
from tests.support.wandb_log import history

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SEED_METRICS = [
    "training/async/n_prev_carry_over_rollouts",
    "training/async/n_completed_rollouts",
    "training/async/n_new_carry_over_rollouts",
    "training/async/new_carry_over_age_max_steps",
    "training/async/proxy_inflight_at_pause",
    "training/async/proxy_drain_seconds",
]


def _manifest(
    tmp_path: Path, *, steps: int, every: int, tool_seconds: float = 0.1, stream: bool = False
) -> Path:
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart-local.yaml").read_text())
    spec = manifest["spec"]
    spec["data"]["inline"] = [
        {"prompt": p, "target": "ab", "tool_seconds": tool_seconds, "stream": stream}
        for p in ("w", "x", "y", "z")
    ]
    spec.update(trainBatchSize=2, totalSteps=steps)
    spec["rollout"]["samplesPerPrompt"] = 2
    spec["async"]["windowSize"] = 4
    spec["trainer"]["checkpoint"]["everySteps"] = every
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def processes_of_run(work_dir: Path) -> list[int]:
    """Live processes of a local run: each carries ASYNCRL_LOCAL_RUN=<its work dir> (agents inherit it)."""
    marker = f"ASYNCRL_LOCAL_RUN={work_dir.absolute()}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def kill_what_is_left(process: subprocess.Popen[str], work_dir: Path) -> None:
    """A failed test must not leave processes behind: the local run and whatever of its run is alive."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for pid in processes_of_run(work_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _local_run(tmp_path: Path, manifest: Path, *, metrics_file: bool = True) -> subprocess.Popen[str]:
    """`asyncrl local run`; with `metrics_file=False` no --metrics-file, so the trainer's default place."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "local",
            "run",
            str(manifest),
            *([f"--metrics-file={tmp_path / 'metrics.jsonl'}"] if metrics_file else []),
            f"--work-dir={tmp_path / 'work'}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # This checkout's code even where another copy of asyncrl is installed; examples/ imports from REPO.
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
        start_new_session=True,
    )


def _run_to_end(tmp_path: Path, path: Path, *, exit_code: int, timeout: float) -> str:
    """`asyncrl local run` of `path` until it exits (nothing of it left behind); its output, once its exit
    code is the one expected."""
    process = _local_run(tmp_path, path)
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        kill_what_is_left(process, tmp_path / "work")
    assert process.returncode == exit_code, output
    return output


def _metrics(tmp_path: Path, path: Path | None = None) -> list[dict[str, float]]:
    path = path or tmp_path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _table(output: str) -> list[list[str]]:
    """The cells of the status table's step lines in `output` (a redone step's first two: "3", "redo")."""
    return [line.split() for line in output.splitlines() if re.match(r"\s+\d+( redo)?\s+\d+\s", line)]


def _rollouts_line(output: str, tmp_path: Path) -> dict[str, int]:
    """The summary's rollouts line as {outcome: count}, checked to account for every agent launched: each is
    in exactly one part (issue 37 item 4; before, "N ended" left out agents a restart or the end stopped)."""
    (line,) = [line for line in output.splitlines() if line.startswith("  rollouts: ")]
    launched, _, rest = line.removeprefix("  rollouts: ").partition(" launched: ")
    parts: dict[str, int] = {}
    for part in rest.replace(";", ",").split(","):
        count, _, what = part.strip().partition(" ")
        parts[what] = int(count)
    assert int(launched) == sum(parts.values()), line
    assert int(launched) == len(list((tmp_path / "work" / "agents").glob("*.log"))), line
    return parts


def test_local_run_trains_asynchronously_and_logs_the_seed_metrics(tmp_path: Path) -> None:
    process = _local_run(tmp_path, _manifest(tmp_path, steps=4, every=2))
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "CARRY-OVER" in output  # the live status table
    assert "FAILED" in output
    assert "run finished\n  steps:    4 (step 0 to 3)\n" in output
    rollouts = _rollouts_line(output, tmp_path)
    assert rollouts["succeeded"] > 0, rollouts
    assert rollouts["failed"] == rollouts["timed out"] == 0, rollouts
    assert re.search(r"  reward:   -?\d\.\d{3} \(step 0\) -> -?\d\.\d{3} \(step 3\)\n", output), output
    assert f"  logs:     {tmp_path / 'work'}/ (trainer.log" in output

    steps = _metrics(tmp_path)
    assert [row["step"] for row in steps] == [0, 1, 2, 3]
    for row in steps:
        for metric in SEED_METRICS:
            assert metric in row
        assert row["training/async/n_completed_rollouts"] == 4  # trainBatchSize 2 groups x n 2
        assert "timing/rollout_queue_wait_seconds_mean" in row
        assert "timing/rollout_run_seconds_max" in row
        assert "actor/pg_loss" in row
        # verl's length summary of the update's rows
        assert row["response_length/min"] <= row["response_length/mean"] <= row["response_length/max"]
        assert row["response_length/max"] > 0
        assert 0.0 <= row["response_length/clip_ratio"] <= 1.0
        assert row["prompt_length/mean"] > 0
    assert any(row["training/async/n_new_carry_over_rollouts"] > 0 for row in steps)
    assert max(row["training/async/new_carry_over_age_max_steps"] for row in steps) >= 1

    (run_dir,) = (tmp_path / "work" / "wandb").glob("offline-run-*")
    logged = history(run_dir)
    assert len(logged) == 4
    for metric in SEED_METRICS:
        assert [row[metric] for row in logged] == [row[metric] for row in steps]


def test_the_toy_agent_switched_to_streaming_is_trained_on_its_streamed_calls(tmp_path: Path) -> None:
    # Also: without --metrics-file the per-step metrics are kept beside the checkpoints (on a cluster, the
    # checkpoint volume), and the summary's curves line names that file.
    process = _local_run(tmp_path, _manifest(tmp_path, steps=2, every=2, stream=True), metrics_file=False)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    kept = tmp_path / "work" / "checkpoints" / "metrics" / "metrics.jsonl"
    assert f"curves: asyncrl plot {kept}" in output
    assert not (tmp_path / "metrics.jsonl").exists()
    steps = _metrics(tmp_path, kept)
    assert [row["step"] for row in steps] == [0, 1]
    for row in steps:
        assert "actor/pg_loss" in row
        assert row["training/adapter/rows"] > 0  # rows built from the captured streamed calls
        assert row["training/adapter/dropped_calls_without_tokens"] == 0
        assert row["training/adapter/dropped_calls_without_logprobs"] == 0


def test_a_trainer_killed_mid_run_redoes_its_lost_steps_and_counts_each_step_once(tmp_path: Path) -> None:
    # A checkpoint every 3 steps: the kill loses up to two updates, which must be redone, not counted.
    process = _local_run(tmp_path, _manifest(tmp_path, steps=6, every=3))
    try:
        wait_for(lambda: len(_metrics(tmp_path)) >= 2, timeout=300, what="two steps")
        pid = int((tmp_path / "work" / "trainer.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=600)
    finally:
        kill_what_is_left(process, tmp_path / "work")
    assert process.returncode == 0, output
    assert "trainer exited with -9; restarting it" in output
    log = (tmp_path / "work" / "trainer.log").read_text()
    assert "active groups" in log  # "recovered N active groups (M complete) from the gateway"
    assert [int(row["step"]) for row in _metrics(tmp_path)] == [0, 1, 2, 3, 4, 5]  # none twice, none lost
    assert "finished: trained steps 0-5 (6 steps;" in log
    assert processes_of_run(tmp_path / "work") == []
    # Issue 37 item 4: every update is a line of the table (the trainer logs one "step N: reward" line per
    # update, across its restart), a step trained again is marked "redo", the first line after the restart
    # says the real time since the line before, and the summary counts the updates.
    updates = re.findall(r"step (\d+): reward ", log)
    table = _table(output)
    assert [cells[0] for cells in table] == updates, output
    seen: set[str] = set()
    for cells in table:
        assert (cells[1] == "redo") == (cells[0] in seen), output
        seen.add(cells[0])
    after_restart = output.partition("trainer exited with -9; restarting it")[2]
    note = (
        r"\n  \(step \d+ (trained again|is the first after the trainer restarted).*; [\d.]+ s since the line"
    )
    assert re.search(note, after_restart), output
    steps_line = next(line for line in output.splitlines() if line.startswith("  steps:    "))
    if len(updates) > 6:
        assert f"; {len(updates)} updates: step" in steps_line, steps_line
    else:
        assert steps_line == "  steps:    6 (step 0 to 5)", steps_line


def test_a_gateway_killed_mid_run_is_restarted_and_the_run_finishes_with_every_step(tmp_path: Path) -> None:
    process = _local_run(tmp_path, _manifest(tmp_path, steps=6, every=2))
    try:
        wait_for(lambda: len(_metrics(tmp_path)) >= 2, timeout=300, what="two steps")
        first_gateway = int((tmp_path / "work" / "gateway.pid").read_text())
        os.killpg(first_gateway, signal.SIGKILL)
        output, _ = process.communicate(timeout=600)
    finally:
        kill_what_is_left(process, tmp_path / "work")
    assert process.returncode == 0, output
    assert "gateway exited with -9; restarting it (1 of 5)" in output
    assert int((tmp_path / "work" / "gateway.pid").read_text()) != first_gateway
    log = (tmp_path / "work" / "trainer.log").read_text()
    assert "the gateway restarted and lost its rollouts" in log
    assert "trainer exited" not in output  # adopted in place, no trainer crash and restart
    assert [int(row["step"]) for row in _metrics(tmp_path)] == [0, 1, 2, 3, 4, 5]
    assert "finished: trained steps 0-5 (6 steps; 6 in this process)" in log
    assert processes_of_run(tmp_path / "work") == []
    _rollouts_line(output, tmp_path)  # the agents the restart stopped are counted too


def test_ctrl_c_stops_every_process_of_the_run_agents_included_promptly(tmp_path: Path) -> None:
    # Slow tools keep agents running at any moment, so Ctrl-C always finds some.
    process = _local_run(tmp_path, _manifest(tmp_path, steps=50, every=10, tool_seconds=3.0))
    work_dir = tmp_path / "work"
    try:
        wait_for(lambda: len(_metrics(tmp_path)) >= 1, timeout=300, what="a first step")
        wait_for(
            lambda: len(processes_of_run(work_dir)) >= 3, timeout=120, what="gateway, trainer and an agent"
        )
        interrupted_at = time.monotonic()
        os.kill(process.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        output, _ = process.communicate(timeout=120)  # generous for a loaded machine; timed below
        stop_seconds = time.monotonic() - interrupted_at
    finally:
        kill_what_is_left(process, tmp_path / "work")
    assert process.returncode == 130, output
    assert "interrupted: stopped the trainer (pid" in output, output
    assert "the gateway (pid" in output
    assert re.search(r"\d+ agents?; no process of the run is left", output), output
    assert processes_of_run(work_dir) == []
    # Not a timing target: a bound that fails only when the stop waits for something it must not (the
    # agents' tools, the trainer's step, a grace period per process); a busy machine once took 10 s.
    assert stop_seconds < 30, f"stopping took {stop_seconds:.1f}s"


def test_a_run_whose_agents_always_crash_fails_after_max_failed_steps_without_restarts(
    tmp_path: Path,
) -> None:
    """Before: such a run trained nothing and ended 'finished' with exit 0 (every rollout failed)."""
    path = _manifest(tmp_path, steps=10, every=100)
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    manifest["spec"]["maxFailedSteps"] = 2
    template = manifest["spec"]["agents"]["template"]["inline"]
    manifest["spec"]["agents"]["template"]["inline"] = template.replace(
        '["python", "-m", "examples.toy_agent.agent"]', '["python", "-c", "raise SystemExit(3)"]'
    )
    path.write_text(yaml.safe_dump(manifest))
    output = _run_to_end(tmp_path, path, exit_code=79, timeout=300)
    assert "trainer stopped (run failed, exit code 79), not restarted" in output
    assert "spec.maxFailedSteps" in output
    assert "run failed: spec.maxFailedSteps steps in a row had nothing to train (exit code 79)" in output
    failed_column = [line.split()[6] for line in output.splitlines() if re.match(r"\s+\d+\s+\d+", line)]
    assert failed_column, output
    assert int(failed_column[-1]) >= 8, output  # 2 steps x 2 groups x 2 samples, at least
    rollouts = _rollouts_line(output, tmp_path)
    assert rollouts["succeeded"] == 0, rollouts
    assert rollouts["failed"] >= 8, rollouts
    assert "restarting it" not in output
    assert output.count("ERROR asyncrl.local.agents the agent of rollout") == 1, output  # the first, once
    assert "failed: exited with 3; its log ends: (empty: " in output, output
    assert [row["step"] for row in _metrics(tmp_path)] == [0, 1]
    assert processes_of_run(tmp_path / "work") == []


def test_a_trainer_that_refuses_its_data_path_fails_the_run_with_the_reason_on_the_console(
    tmp_path: Path,
) -> None:
    """Before: the trainer crashed on the missing file, was restarted three times, and the console said only
    'trainer failed 4 times; see trainer.log'."""
    path = _manifest(tmp_path, steps=2, every=100)
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    manifest["spec"]["data"] = {"path": str(tmp_path / "missing.parquet")}
    path.write_text(yaml.safe_dump(manifest))
    output = _run_to_end(tmp_path, path, exit_code=78, timeout=300)
    assert (
        "trainer stopped (configuration error, exit code 78), not restarted: asyncrl trainer: "
        f"spec.data.path: cannot read data file {tmp_path / 'missing.parquet'}: No such file or directory"
        in output
    ), output
    assert "restarting it" not in output
    assert "run failed: the trainer refused its configuration (exit code 78)" in output
    assert "  steps:    none trained" in output
    assert processes_of_run(tmp_path / "work") == []


def _with_template(path: Path, old: str, new: str) -> None:
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    template = manifest["spec"]["agents"]["template"]["inline"]
    assert old in template
    manifest["spec"]["agents"]["template"]["inline"] = template.replace(old, new)
    path.write_text(yaml.safe_dump(manifest))


def _refused_before_start(tmp_path: Path, path: Path) -> str:
    output = _run_to_end(tmp_path, path, exit_code=1, timeout=120)
    assert output.rstrip().endswith("nothing was started"), output
    assert not (tmp_path / "work" / "gateway.log").exists()  # no process of the run was started
    assert not (tmp_path / "work" / "trainer.log").exists()
    assert "ERROR" not in output, output
    return output


def test_an_agent_command_that_does_not_exist_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Issue 37 item 5: `validate` said valid (on a cluster the command is in the image), and `local run`
    exited 79 after 14 s with 72 failed rollouts and the cause nowhere: not on the console, not in any log."""
    path = _manifest(tmp_path, steps=2, every=100)
    _with_template(path, '["python", "-m", "examples.toy_agent.agent"]', '["toy-agnet", "--fast"]')
    output = _refused_before_start(tmp_path, path)
    assert (
        f"asyncrl local run: {path}: spec.agents.template: the agent's command 'toy-agnet' is not found on "
        "the agents' PATH" in output
    ), output


def test_a_template_error_on_every_row_is_refused_before_anything_starts_as_validate_says_it(
    tmp_path: Path,
) -> None:
    """Issue 37 item 5: `validate` caught it, but `local run` started anyway and printed 76 ERROR lines
    before exiting 79 after 15 s. Now it prints validate's own line, once, and starts nothing."""
    path = _manifest(tmp_path, steps=2, every=100)
    _with_template(path, "{{ input | tojson }}", "{{ input.missing_field | tojson }}")
    validate = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert validate.returncode == 1, validate.stdout
    problem = validate.stdout.strip().splitlines()[0].removeprefix(f"{path}: ")
    assert "spec.agents.template" in problem, validate.stdout
    assert "missing_field" in problem, validate.stdout
    output = _refused_before_start(tmp_path, path)
    assert f"asyncrl local run: {path}: {problem}" in output, output
    assert output.count("spec.agents.template") == 1, output


def test_an_agent_that_cannot_be_started_says_why_on_the_console_and_in_its_log(tmp_path: Path) -> None:
    """An executable whose interpreter does not exist passes the check (the file is there) but cannot be run:
    its rollouts fail with the reason on the console, once, and in each agent's log (before: an empty log,
    and nothing on the console)."""
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/nonexistent/interpreter\nexit 0\n")
    agent.chmod(0o755)
    path = _manifest(tmp_path, steps=10, every=100)
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    manifest["spec"]["maxFailedSteps"] = 1
    path.write_text(yaml.safe_dump(manifest))
    _with_template(path, '["python", "-m", "examples.toy_agent.agent"]', f'["{agent}"]')
    output = _run_to_end(tmp_path, path, exit_code=79, timeout=300)
    assert output.count("ERROR asyncrl.local.agents the agent of rollout") == 1, output
    assert f"failed: cannot start '{agent}': No such file or directory" in output, output
    logs = [log.read_text() for log in (tmp_path / "work" / "agents").glob("*.log")]
    assert logs, "no agent log"
    assert all(f"cannot start '{agent}'" in log for log in logs), logs
