"""Images enter the node from tarballs (nothing can be pulled here); a new build of a tag replaces the old
one without leaving it, or the pin that guards shared layers during the unpack, behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.imagestore import PIN_SUFFIX
from asyncrl.testing.node import NodeCluster
from asyncrl.testing.ociimage import ImageConfig, write_image_archive

pytestmark = [pytest.mark.node, pytest.mark.slow]


def _images(node_cluster: NodeCluster) -> list[dict[str, Any]]:
    listing = subprocess.run(
        [*node_cluster.crictl(), "images", "--output=json"], capture_output=True, text=True, check=True
    )
    images: list[dict[str, Any]] = json.loads(listing.stdout)["images"]
    return images


def _build(tmp_path: Path, output: Path, name: str, version: str) -> str:
    rootfs = tmp_path / f"rootfs-{version}"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "build").write_text(version)
    return write_image_archive(rootfs=rootfs, name=name, output=output, config=ImageConfig())


def test_a_new_build_of_an_imported_tag_replaces_the_old_one_and_leaves_no_pin(
    node_cluster: NodeCluster, tmp_path: Path
) -> None:
    name = f"asyncrl.local/rebuilt-{tmp_path.name[-8:].lower().replace('_', '-')}:dev"
    tarball = tmp_path / "rebuilt.tar"
    first = _build(tmp_path, tarball, name, "1")
    assert node_cluster.import_images([tarball]) == [name]
    assert node_cluster.import_images([tarball]) == [name], "an unchanged tarball is taken as imported"

    second = _build(tmp_path, tarball, name, "2")
    assert second != first
    assert node_cluster.import_images([tarball]) == [name]

    images = _images(node_cluster)
    ids = {str(image["id"]) for image in images}
    tagged = {tag: str(image["id"]) for image in images for tag in image.get("repoTags") or []}
    assert tagged.get(f"docker.io/{name}", tagged.get(name)) == second, tagged
    assert first not in ids, "the previous build stays on the node, unnamed, filling its disk"
    assert not [tag for tag in tagged if PIN_SUFFIX in tag], "the import left its pin on the previous build"
