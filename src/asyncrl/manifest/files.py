"""Read an AsyncTrainingRun manifest file, and say in one line what is wrong with it when it cannot be read.

`kubectl apply -f` names the file and the line of a YAML error; so do the commands that read a manifest
here (`asyncrl validate`, `render-agent-job`, `local run`). An empty file, a list or a scalar at the top, or
several documents in one file are refused with a sentence, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from asyncrl.api import AsyncTrainingRun, load_run


class ManifestError(ValueError):
    """The file cannot be read as one manifest: `FILE: reason`, on one line."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class ManifestFile:
    path: Path
    document: dict[str, Any]  # the parsed YAML, as written

    def run(self) -> AsyncTrainingRun:
        """The validated run, or `InvalidRunError` listing every failing field."""
        return load_run(self.document)


def read_manifest(path: Path) -> ManifestFile:
    """The one YAML mapping in `path`, or `ManifestError` saying why not."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ManifestError(path, f"cannot read it: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ManifestError(path, f"not a text file ({error.reason})") from error
    try:
        documents = [document for document in yaml.safe_load_all(text) if document is not None]
    except yaml.YAMLError as error:
        raise ManifestError(path, yaml_error_text(error)) from error
    if not documents:
        raise ManifestError(
            path, "empty; expected an AsyncTrainingRun manifest (apiVersion, kind, metadata, spec)"
        )
    if len(documents) > 1:
        raise ManifestError(path, f"{len(documents)} YAML documents; give one AsyncTrainingRun per file")
    (document,) = documents
    if not isinstance(document, dict):
        what = "a list" if isinstance(document, list) else f"a {type(document).__name__}"
        raise ManifestError(
            path,
            f"{what} at the top level; expected an AsyncTrainingRun manifest, a mapping with apiVersion, "
            "kind, metadata and spec",
        )
    return ManifestFile(path=path, document=document)


def yaml_error_text(error: yaml.YAMLError) -> str:
    """`line L, column C: not valid YAML: problem (context)`, on one line (counted from 1 as editors do)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if context and context_mark is not None:
        context = f"{context} that starts at line {context_mark.line + 1}, column {context_mark.column + 1}"
    reason = f"{problem} ({context})" if context else problem
    return f"{where}not valid YAML: {' '.join(str(reason).split())}"
