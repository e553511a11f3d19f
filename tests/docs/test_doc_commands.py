"""Every shell command of the docs either runs here, in this test, or its block says why it cannot.

A fenced block in `sh`, `bash`, `shell` or `console` is run command by command unless its info string names
why not: ```` ```sh not-here: REASON ```` with REASON one of `NOT_HERE` (a kind cluster, a GPU, a Docker
engine, a real cluster's nodes, a placeholder to fill in, a long-running server, a fresh install, a long
benchmark, CI's whole suite). What runs here: `asyncrl ...` (this checkout's CLI) and `helm template` /
`helm lint` (the provisioned helm, with no `--kube-version`: the provisioning script stamps helm like a
release). The commands run in a scratch folder that holds links to the repository's charts/, crds/,
examples/ and operator/, a `metrics.jsonl` of a short run and a `my-run.yaml`, so the docs' relative paths
and example names work as written.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncrl.testing.controlplane import default_bin_dir

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(path for path in REPO.glob("*/README.md") if path.parent.name not in {"tests", "src"}),
    ]
)
SHELLS = {"sh", "bash", "shell", "console"}
NOT_HERE = {"kind", "gpu", "docker", "cluster", "placeholder", "server", "install", "benchmark", "ci"}
FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<language>[\w-]*)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```",
    re.MULTILINE | re.DOTALL,
)
METRICS = "\n".join(
    f'{{"step": {step}, "critic/score/mean": {step / 10}, "training/async/n_new_carry_over_rollouts": 4, '
    f'"training/async/new_carry_over_age_max_steps": 1, "timing_s/step": 2.0}}'
    for step in range(4)
)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    info: str
    commands: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def _commands(body: str) -> tuple[str, ...]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    commands = []
    for line in joined.splitlines():
        command = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if command:
            commands.append(command)
    return tuple(commands)


def shell_blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        text = doc.read_text()
        for fence in FENCE.finditer(text):
            if fence.group("language") not in SHELLS:
                continue
            line = text.count("\n", 0, fence.start()) + 1
            blocks.append(Block(doc, line, fence.group("info").strip(), _commands(fence.group("body"))))
    return blocks


def _not_here(block: Block) -> str | None:
    found = re.fullmatch(r"not-here:\s*(\S+)", block.info)
    return found.group(1) if found else None


BLOCKS = shell_blocks()
RUN_HERE = [block for block in BLOCKS if _not_here(block) is None]


def test_every_block_that_cannot_run_here_says_why_with_a_known_reason() -> None:
    for block in BLOCKS:
        reason = _not_here(block)
        if block.info and reason is None:
            pytest.fail(f"{block.where}: info {block.info!r}; use `not-here: REASON` ({sorted(NOT_HERE)})")
        if reason is not None:
            assert reason in NOT_HERE, (
                f"{block.where}: unknown reason {reason!r}; use one of {sorted(NOT_HERE)}"
            )


def test_the_docs_have_commands_that_run_here() -> None:
    runnable = [command for block in RUN_HERE for command in block.commands]
    assert any(command.startswith("asyncrl plot") for command in runnable)
    assert any(command.startswith("helm template") for command in runnable)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    for name in ("charts", "crds", "examples", "operator"):
        (folder / name).symlink_to(REPO / name)
    (folder / "metrics.jsonl").write_text(METRICS + "\n")
    shutil.copy(REPO / "examples" / "run-minimal.yaml", folder / "my-run.yaml")
    return folder


def _argv(command: str, where: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "asyncrl":
        return [sys.executable, "-m", "asyncrl.cli", *argv[1:]]
    if argv[:2] in (["helm", "template"], ["helm", "lint"]):
        helm = default_bin_dir() / "helm"
        if not os.access(helm, os.X_OK):
            pytest.fail(f"helm is not provisioned ({helm}); run scripts/provision-k8s.sh", pytrace=False)
        return [str(helm), *argv[1:]]
    pytest.fail(
        f"{where}: `{command}` cannot run in this test; run it from a test, or mark its block "
        f"`not-here: REASON` ({sorted(NOT_HERE)})",
        pytrace=False,
    )


@pytest.mark.parametrize("block", RUN_HERE, ids=[block.where for block in RUN_HERE])
def test_the_command_runs_as_written(block: Block, scratch: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
    }
    for command in block.commands:
        done = subprocess.run(
            _argv(command, block.where), cwd=scratch, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{block.where}: `{command}` exited {done.returncode}:\n{done.stderr}"
