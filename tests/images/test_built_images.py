"""The images scripts/provision-images.sh built, checked in the tarballs it saved (`docker save`).

test_dockerfiles.py reads what the build files say; this reads what came out of them: each image's config
(its user, entrypoint, environment, ports and the inputs hash it was labelled with) and the files of its
small layers (owners, the examples package), with Python's tarfile, so no Docker engine is needed and the
multi-gigabyte layers are never read. The inputs hash is computed here as the script computes it, so an
image built from another tree is told apart.

Without the tarballs the tests skip, naming the script; with ASYNCRL_REQUIRE_IMAGES=1 they fail instead, and
an image built from a tree other than this one fails too (without it, that is a skip: the tree changes
under a developer's hands long before anyone rebuilds multi-gigabyte images).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncrl.workloads import children
from tests.images.test_dockerfiles import IMAGES, REPO, context_files, copied_sources

CACHE_DIR = Path(os.environ.get("ASYNCRL_CACHE_DIR") or Path.home() / ".cache" / "asyncrl")
IMAGES_DIR = CACHE_DIR / "images"
INPUTS_LABEL = "asyncrl.dev/inputs"
REQUIRED = os.environ.get("ASYNCRL_REQUIRE_IMAGES") == "1"
# Layers larger than this (the base, the virtual environment) are not listed: it would take seconds.
SMALL_LAYER_BYTES = 64 * 1024 * 1024
# The images the script builds: its name for each (the tarball's), and the tag.
BUILT = {
    "operator": "ghcr.io/asyncrl/operator:0.1.0",
    "gateway": "ghcr.io/asyncrl/gateway:0.1.0",
    "trainer-cpu": "ghcr.io/asyncrl/trainer-cpu:0.1.0",
}
built_names = pytest.mark.parametrize("name", sorted(BUILT))


@dataclass(frozen=True)
class SavedImage:
    repo_tags: list[str]
    config: dict[str, Any]
    # Every path of the small layers (no leading slash), with the member as the last such layer has it.
    small_layer_files: dict[str, tarfile.TarInfo]


def read_saved_image(tarball: Path) -> SavedImage:
    """The image config and the small layers' files of a `docker save` tarball (one image)."""
    with tarfile.open(tarball) as archive:
        manifest = _json_member(archive, "manifest.json")
        assert isinstance(manifest, list), f"{tarball}: manifest.json is not a list"
        assert len(manifest) == 1, f"{tarball}: {len(manifest)} images, not one"
        (entry,) = manifest
        config = _json_member(archive, entry["Config"])
        files: dict[str, tarfile.TarInfo] = {}
        for layer_name in entry["Layers"]:
            layer_member = archive.getmember(layer_name)
            if layer_member.size > SMALL_LAYER_BYTES:
                continue
            layer_file = archive.extractfile(layer_member)
            assert layer_file is not None
            with tarfile.open(fileobj=layer_file) as layer:
                for member in layer:
                    files[member.name.removeprefix("./").rstrip("/")] = member
    return SavedImage(repo_tags=entry.get("RepoTags") or [], config=config, small_layer_files=files)


def _json_member(archive: tarfile.TarFile, name: str) -> Any:
    member = archive.extractfile(name)
    assert member is not None, f"{name} is not a file in {archive.name!r}"
    return json.load(member)


def inputs_hash(dockerfile: str, base_image_id: str) -> str:
    """The hash scripts/provision-images.sh labels an image with (its `inputs_hash`): sha256 over the
    `sha256sum` lines, sorted by path, of the Dockerfile, its ignore files and every file its COPY sources
    hold, then `base <base image ID>`."""
    files = {dockerfile, ".dockerignore"}
    if (REPO / f"{dockerfile}.dockerignore").is_file():
        files.add(f"{dockerfile}.dockerignore")
    for source in copied_sources(REPO / dockerfile):
        files.update(context_files(source))
    lines = [f"{hashlib.sha256((REPO / file).read_bytes()).hexdigest()}  {file}\n" for file in sorted(files)]
    lines.append(f"base {base_image_id}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _missing(message: str) -> None:
    if REQUIRED:
        pytest.fail(f"{message} (ASYNCRL_REQUIRE_IMAGES=1: the built images must be checked)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def images_json() -> dict[str, Any]:
    path = IMAGES_DIR / "images.json"
    if not path.is_file():
        _missing(f"no images built here ({path} is missing): run scripts/provision-images.sh")
    value = json.loads(path.read_text())
    assert isinstance(value, dict)
    return value


_saved: dict[str, SavedImage] = {}


def saved_image(name: str) -> SavedImage:
    tarball = IMAGES_DIR / f"{name}.tar"
    if not tarball.is_file():
        _missing(f"{tarball} is missing: run scripts/provision-images.sh")
    if name not in _saved:
        _saved[name] = read_saved_image(tarball)
    return _saved[name]


@built_names
def test_saved_image_is_the_tagged_image_labelled_with_its_stamp(
    name: str, images_json: dict[str, Any]
) -> None:
    image = saved_image(name)
    assert image.repo_tags == [BUILT[name]]
    label = (image.config["config"].get("Labels") or {}).get(INPUTS_LABEL)
    stamp = (IMAGES_DIR / f"{name}.inputs").read_text().strip()
    assert label == stamp, f"{name}.tar is labelled {label} but its stamp says {stamp}"
    entry = images_json[name]
    assert entry["tag"] == BUILT[name]
    assert entry["inputs"] == label
    assert Path(entry["tarball"]).name == f"{name}.tar"
    assert entry["size_bytes"] > 0
    assert entry["base_image_id"].startswith("sha256:")


@built_names
def test_saved_image_was_built_from_this_tree(name: str, images_json: dict[str, Any]) -> None:
    label = saved_image(name).config["config"]["Labels"][INPUTS_LABEL]
    expected = inputs_hash(IMAGES[name].dockerfile, images_json[name]["base_image_id"])
    if label != expected:
        message = (
            f"{name}.tar was built from other inputs than this tree's ({label} != {expected}): "
            "run scripts/provision-images.sh again"
        )
        if REQUIRED:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@built_names
def test_runs_as_numeric_non_root_user_and_starts_the_subcommand(name: str) -> None:
    config = saved_image(name).config["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["asyncrl", IMAGES[name].subcommand]
    assert config["Cmd"] == ["--help"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PATH"].startswith("/opt/asyncrl/bin:"), env["PATH"]
    exposed = {int(port.split("/")[0]) for port in config.get("ExposedPorts") or {}}
    assert exposed == set(IMAGES[name].ports)


def test_cpu_trainer_image_holds_examples_and_a_checkpoint_directory_of_its_user() -> None:
    image = saved_image("trainer-cpu")
    config = image.config["config"]
    workdir = config["WorkingDir"].lstrip("/")
    files = image.small_layer_files
    for module in ("examples/__init__.py", "examples/toy_agent/__init__.py", "examples/toy_agent/agent.py"):
        assert f"{workdir}/{module}" in files, f"{module} is not in the working directory /{workdir}"
    checkpoints = files.get(children.CHECKPOINT_DIR.lstrip("/"))
    assert checkpoints is not None, f"{children.CHECKPOINT_DIR} is not in the image"
    assert checkpoints.isdir()
    assert (checkpoints.uid, checkpoints.gid) == (10001, 10001)
    env = dict(item.split("=", 1) for item in config["Env"])
    for key in ("HF_HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "MPLCONFIGDIR"):
        assert env[key].startswith("/tmp/"), f"{key}={env[key]}: the root filesystem is read-only"


def test_inputs_hash_covers_the_copied_files_and_the_base() -> None:
    dockerfile = IMAGES["trainer-cpu"].dockerfile
    one = inputs_hash(dockerfile, "sha256:1")
    assert one == inputs_hash(dockerfile, "sha256:1")
    assert one != inputs_hash(dockerfile, "sha256:2")
    assert inputs_hash(IMAGES["operator"].dockerfile, "sha256:1") != inputs_hash(
        IMAGES["gateway"].dockerfile, "sha256:1"
    )
