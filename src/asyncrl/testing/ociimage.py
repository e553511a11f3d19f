"""Pack a root filesystem into an image tarball that `ctr images import` accepts, with no Docker engine.

The test node's containerd can pull nothing (no registry is reachable from here), so every image it runs is
imported from a tarball. The sandbox image (`pause`) and a busybox image for smoke tests are made from a
directory on this machine: one uncompressed layer, a config, and the `docker save` layout (`manifest.json`,
`<config digest>.json`, `<layer digest>/layer.tar`), which containerd's importer reads and tags from
`RepoTags`. The layer is deterministic (sorted entries, owner root, mtime 0), so the same rootfs gives the
same image ID and a cache can compare IDs.

Standard library only: `scripts/provision-node.sh` runs it with the system Python before any venv exists
(`PYTHONPATH=src python3 -m asyncrl.testing.ociimage ...`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class ImageConfig:
    """The part of an OCI image config a container starts from."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = (DEFAULT_PATH,)
    user: str = ""
    working_dir: str = "/"


def host_architecture() -> str:
    """The OCI architecture name of this machine (amd64, arm64)."""
    machine = platform.machine()
    return _ARCHITECTURES.get(machine, machine)


def _normalize(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    member.mtime = 0
    return member


def layer_tar(rootfs: Path) -> bytes:
    """An uncompressed tar of `rootfs`'s contents (names relative to it), sorted, owned by root, mtime 0."""
    if not rootfs.is_dir():
        raise FileNotFoundError(f"root filesystem {rootfs} is not a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(rootfs.iterdir()):
            tar.add(child, arcname=child.name, recursive=True, filter=_normalize)
    return buffer.getvalue()


def image_config_json(*, diff_id: str, config: ImageConfig, architecture: str) -> bytes:
    """The image config blob: one layer, the container config, a fixed creation time (reproducible)."""
    container: dict[str, object] = {"Env": list(config.env), "WorkingDir": config.working_dir}
    if config.entrypoint:
        container["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        container["Cmd"] = list(config.cmd)
    if config.user:
        container["User"] = config.user
    document = {
        "architecture": architecture,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": container,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "asyncrl.testing.ociimage"}],
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def write_image_archive(
    *,
    rootfs: Path,
    name: str,
    output: Path,
    config: ImageConfig,
    architecture: str | None = None,
) -> str:
    """Write `rootfs` as image `name` (e.g. `asyncrl.local/pause:3.10`) to the tarball `output`, in the
    `docker save` layout; return the image ID (`sha256:` of its config). The file is replaced atomically."""
    layer = layer_tar(rootfs)
    layer_hex = hashlib.sha256(layer).hexdigest()
    config_blob = image_config_json(
        diff_id=f"sha256:{layer_hex}", config=config, architecture=architecture or host_architecture()
    )
    config_hex = hashlib.sha256(config_blob).hexdigest()
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": [name], "Layers": [f"{layer_hex}/layer.tar"]}]
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"image name {name!r} needs a tag (name:tag)")
    repositories = {repository: {tag: config_hex}}
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=output.parent, prefix=f".{output.name}.", delete=False) as handle:
        staging = Path(handle.name)
        with tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as archive:
            _add_bytes(archive, f"{layer_hex}/", None)
            _add_bytes(archive, f"{layer_hex}/layer.tar", layer)
            _add_bytes(archive, f"{config_hex}.json", config_blob)
            _add_bytes(archive, "manifest.json", json.dumps(manifest).encode())
            _add_bytes(archive, "repositories", json.dumps(repositories).encode())
    staging.chmod(0o644)
    staging.replace(output)
    return f"sha256:{config_hex}"


def archive_tags(path: Path) -> list[str]:
    """The tags a `docker save` tarball carries (its manifest's RepoTags), in order."""
    with tarfile.open(path) as archive:
        member = archive.extractfile("manifest.json")
        if member is None:
            raise ValueError(f"{path} has no manifest.json")
        manifest = json.load(member)
    return [tag for entry in manifest for tag in entry.get("RepoTags") or []]


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name.rstrip("/"))
    info.mtime = 0
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        archive.addfile(info)
    else:
        info.size = len(data)
        info.mode = 0o644
        archive.addfile(info, io.BytesIO(data))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asyncrl.testing.ociimage",
        description="Pack a root filesystem directory into an image tarball for `ctr images import`.",
    )
    parser.add_argument("--rootfs", type=Path, required=True, help="directory holding the image's files")
    parser.add_argument("--name", required=True, help="image name with tag, e.g. asyncrl.local/pause:3.10")
    parser.add_argument("--output", type=Path, required=True, help="tarball to write")
    parser.add_argument("--entrypoint", action="append", default=[], help="one argument (repeat)")
    parser.add_argument("--cmd", action="append", default=[], help="one argument (repeat)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE (repeat; default PATH only)")
    parser.add_argument("--user", default="", help="user[:group] the container runs as")
    args = parser.parse_args(argv)
    config = ImageConfig(
        entrypoint=tuple(args.entrypoint),
        cmd=tuple(args.cmd),
        env=tuple(args.env) or (DEFAULT_PATH,),
        user=args.user,
    )
    image_id = write_image_archive(rootfs=args.rootfs, name=args.name, output=args.output, config=config)
    print(image_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
