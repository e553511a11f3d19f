"""What the tests of the scripts/provision-*.sh scripts share: a cache that already holds a (fake) build, and
an environment without Go, so that a rebuild fails saying so instead of building."""

from __future__ import annotations

import shutil
from pathlib import Path


def provisioned(directory: Path, *, binary: str, crd: str | None) -> Path:
    """`directory` with `bin/<binary>` (a script that exits 0) and, unless `crd` is None, `crds/<crd>`."""
    (directory / "bin").mkdir(parents=True)
    executable = directory / "bin" / binary
    executable.write_text("#!/bin/sh\nexit 0\n")
    executable.chmod(0o755)
    if crd is not None:
        (directory / "crds").mkdir()
        (directory / "crds" / crd).write_text("kind: CustomResourceDefinition\n")
    return directory


def without_go(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds only the tools the scripts need before they look for Go."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "mkdir", "date", "sed", "printf", "cat"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    return {"PATH": str(tools), "HOME": str(tmp_path), "ASYNCRL_CACHE_DIR": str(tmp_path / "cache")}
