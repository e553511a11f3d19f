"""Where the test node's containerd keeps its images, kept across runs so that an image is imported once.

Nothing can be pulled here, so each image enters the node from a tarball; unpacking one of the project's
images takes seconds to minutes (the CPU trainer's is several GB). containerd's root (content store,
snapshots, metadata) therefore lives in the cache and is reused by the next node, one node at a time: a
node holds an exclusive lock on it while it runs, and a second node started meanwhile gets a root of its
own for its lifetime. A tarball is imported again only when its size or modification time changed since its
last import into this root, or when one of its image names is gone from containerd.

The lock dies with its process, so a node killed mid-run leaves the root usable; its leftover pods are
removed through the CRI by the next node before the kubelet starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from asyncrl.testing import hoststate

logger = logging.getLogger(__name__)


@dataclass
class ImageStore:
    """containerd's root directory for one node: shared in the cache (`persistent`) or its own."""

    root: Path
    persistent: bool
    _lock_fd: int | None = None

    @classmethod
    def acquire(cls, *, shared_root: Path | None, own_root: Path) -> ImageStore:
        """The shared root when it is given and free, else `own_root`."""
        if shared_root is not None:
            shared_root.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(shared_root.parent / f"{shared_root.name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                logger.info("image store %s is in use by another node; this one uses its own", shared_root)
            else:
                shared_root.mkdir(exist_ok=True)
                # A containerd killed while unpacking leaves temporary mounts; none is in use now.
                hoststate.unmount_all_under(shared_root)
                return cls(root=shared_root, persistent=True, _lock_fd=fd)
        own_root.mkdir(parents=True, exist_ok=True)
        return cls(root=own_root, persistent=False)

    def release(self) -> None:
        if self._lock_fd is not None:
            hoststate.unmount_all_under(self.root)
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def _stamps_path(self) -> Path:
        return self.root.parent / f"{self.root.name}-imports.json"

    def _stamps(self) -> dict[str, dict[str, object]]:
        with contextlib.suppress(FileNotFoundError, ValueError):
            stamps: dict[str, dict[str, object]] = json.loads(self._stamps_path.read_text())
            return stamps
        return {}

    @staticmethod
    def _stamp(tarball: Path) -> dict[str, object]:
        status = tarball.stat()
        return {"size": status.st_size, "mtime_ns": status.st_mtime_ns}

    def imported_names(self, tarball: Path, *, present: set[str]) -> list[str] | None:
        """The image names of `tarball` when this store already holds its current contents, else None."""
        if not self.persistent:
            return None
        entry = self._stamps().get(str(tarball.resolve()))
        if entry is None or {k: entry.get(k) for k in ("size", "mtime_ns")} != self._stamp(tarball):
            return None
        names = entry.get("names")
        if not isinstance(names, list) or not names or not set(names) <= present:
            return None
        return [str(name) for name in names]

    def previous_names(self, tarball: Path) -> set[str]:
        """The image names the last import of `tarball` into this store gave (empty when there was none)."""
        names = self._stamps().get(str(tarball.resolve()), {}).get("names")
        return {str(name) for name in names} if isinstance(names, list) else set()

    def record_import(self, tarball: Path, names: list[str]) -> None:
        if not self.persistent:
            return
        stamps = self._stamps()
        stamps[str(tarball.resolve())] = {**self._stamp(tarball), "names": names}
        staging = self._stamps_path.with_suffix(".tmp")
        staging.write_text(json.dumps(stamps, indent=1) + "\n")
        staging.replace(self._stamps_path)


PIN_SUFFIX = "asyncrl-import-pin"


def pin_name(name: str) -> str:
    """A second name for the image `name` points at: the same repository, its tag (or "latest") followed by
    a suffix no build uses (`a/b:dev` -> `a/b:dev-asyncrl-import-pin`)."""
    repository, _, digest = name.partition("@")
    if digest:
        return f"{repository}:{PIN_SUFFIX}"
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:
        return f"{repository}-{PIN_SUFFIX}"
    return f"{repository}:latest-{PIN_SUFFIX}"
