"""A whole AsyncTrainingRun manifest, and the checks local mode runs where the API server would.

Local mode has no API server, yet it must reject the manifests that `kubectl apply` rejects and say why in the
same words. `load_run` validates a manifest with the same rules the CRD's schema and CEL rules enforce and
names each failing field by its path on the wire; `check_update` mirrors the CRD's immutability rules.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from asyncrl.api.field_names import unknown_field_message
from asyncrl.api.schema import structural_schema
from asyncrl.api.types.meta import API_VERSION, KIND, ApiModel, FieldRuleError
from asyncrl.api.types.rules import IMMUTABLE_FIELDS, check_run_name, immutable_message
from asyncrl.api.types.spec import AsyncTrainingRunSpec
from asyncrl.api.types.status import AsyncTrainingRunStatus


class AsyncTrainingRun(ApiModel):
    """An asynchronous RL training run of an LLM agent (asyncrl.dev/v1alpha1)."""

    api_version: str = Field(description="asyncrl.dev/v1alpha1")
    kind: str = Field(description="AsyncTrainingRun")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: AsyncTrainingRunSpec = Field(description="What to train and how.")
    status: AsyncTrainingRunStatus | None = Field(
        default=None, description="Progress, written by the operator."
    )

    @field_validator("api_version")
    @classmethod
    def _known_api_version(cls, value: str) -> str:
        if value != API_VERSION:
            raise ValueError(f"expected {API_VERSION}, got {value!r}")
        return value

    @field_validator("metadata")
    @classmethod
    def _name_fits_child_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        name = value.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise FieldRuleError("must be a string", field_path=("name",))
            try:
                check_run_name(name)
            except ValueError as error:
                raise FieldRuleError(str(error), field_path=("name",)) from None
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value != KIND:
            raise ValueError(f"expected {KIND}, got {value!r}")
        return value

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


class FieldError(BaseModel):
    """One reason a manifest is invalid: the field's path on the wire and what is wrong with it."""

    model_config = ConfigDict(frozen=True)

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidRunError(ValueError):
    """A manifest that the API server would reject; `errors` lists every failing field."""

    def __init__(self, name: str, errors: list[FieldError]) -> None:
        self.name = name
        self.errors = errors
        what = f"AsyncTrainingRun {name!r}" if name else "AsyncTrainingRun"
        super().__init__(f"invalid {what}:\n" + "\n".join(f"  {error}" for error in errors))


# Fields renamed before v1alpha1 was released (CHANGELOG.md): an old manifest is told the new name.
RENAMED_FIELDS = {
    "spec.rollout.n": "spec.rollout.samplesPerPrompt",
    "spec.async.asyncTrainBatchSize": "spec.async.windowSize",
    "spec.trainer.level": "spec.trainer.sampleLevel",
    "spec.trainer.fillReward": "spec.trainer.failedRolloutReward",
}
# What YAML 1.1 (kubectl, Helm, PyYAML) reads as a boolean when written bare as a key.
YAML_BOOLEAN_WORDS = "y, n, yes, no, on or off"


def load_run(manifest: Mapping[str, Any]) -> AsyncTrainingRun:
    """Validate a whole manifest (a parsed YAML document) as the API server would, or `InvalidRunError`."""
    if not isinstance(manifest, Mapping):  # an empty file parses to None, a stray list to a list
        what = "empty" if manifest is None else f"a YAML {type(manifest).__name__}"
        raise InvalidRunError(
            "",
            [
                FieldError(
                    path="(top level)",
                    message=f"the manifest is {what}; write one AsyncTrainingRun mapping "
                    "(apiVersion, kind, metadata, spec), as in examples/quickstart-local.yaml",
                )
            ],
        )
    metadata = manifest.get("metadata")
    name = str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""
    boolean_keys = list(_boolean_keys(manifest, ""))
    if boolean_keys:
        raise InvalidRunError(name, boolean_keys)
    try:
        return AsyncTrainingRun.model_validate(manifest, by_alias=True, by_name=False)
    except ValidationError as error:
        raise InvalidRunError(name, [_field_error(detail) for detail in error.errors()]) from None


def _boolean_keys(node: Any, path: str) -> Iterator[FieldError]:
    """Mapping keys that YAML 1.1 turned into booleans: a bare `n:` or `off:` never names a field."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if isinstance(key, bool) or key in ("true", "false"):
                renamed = RENAMED_FIELDS.get(f"{path}.n".lstrip("."), "")
                hint = f" ({renamed.removeprefix('spec.')})" if renamed else ""
                yield FieldError(
                    path=path.lstrip(".") or "(top level)",
                    message=(
                        f"the key {str(key).lower()!r} is how YAML 1.1 reads a bare {YAML_BOOLEAN_WORDS}; "
                        f"rename it{hint} or quote it"
                    ),
                )
                continue
            yield from _boolean_keys(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _boolean_keys(item, f"{path}[{index}]")


def check_update(old: AsyncTrainingRunSpec, new: AsyncTrainingRunSpec) -> None:
    """Reject a spec change to an immutable field, as the CRD's transition rules do."""
    old_wire, new_wire = old.to_wire(), new.to_wire()
    errors = [
        FieldError(path=f"spec.{path}", message=immutable_message(path))
        for path in IMMUTABLE_FIELDS
        if _lookup(old_wire, path) != _lookup(new_wire, path)
    ]
    if errors:
        raise InvalidRunError("", errors)


def _lookup(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


# Scalar types the CRD's schema enforces without coercion; local mode's message says what was given instead.
_EXPECTED_SCALARS = {
    "bool_type": "a boolean (true or false)",
    "int_type": "an integer",
    "float_type": "a number",
}


def _scalar_message(detail: ErrorDetails) -> str | None:
    expected = _EXPECTED_SCALARS.get(detail["type"])
    if expected is None:
        return None
    given = detail.get("input")
    if isinstance(given, str):
        return f"must be {expected}, not the string {given!r}"
    return f"must be {expected}, not {type(given).__name__} {given!r}"


def _enum_hint(detail: ErrorDetails) -> str:
    """`; did you mean 'Token'?` for `token` or `Tokn`: enum values are CamelCase, as Kubernetes' own are."""
    given = detail.get("input")
    if not isinstance(given, str):
        return ""
    allowed = re.findall(r"'([^']*)'", str(detail.get("ctx", {}).get("expected", "")))
    folded = {value.lower(): value for value in allowed}
    close = (
        [folded[given.lower()]] if given.lower() in folded else difflib.get_close_matches(given, allowed, n=1)
    )
    return f"; did you mean {close[0]!r}?" if close else ""


@cache
def _wire_schema() -> Mapping[str, Any]:
    """The run's structural schema, as the CRD holds it: what an unknown field's hint names."""
    return structural_schema(AsyncTrainingRun)


def _field_error(detail: ErrorDetails) -> FieldError:
    location = [str(part) if isinstance(part, str) else f"[{part}]" for part in detail["loc"]]
    cause = detail.get("ctx", {}).get("error")
    if isinstance(cause, FieldRuleError):
        location.extend(cause.field_path)
    message = str(cause) if isinstance(cause, ValueError) else _scalar_message(detail) or detail["msg"]
    path = ".".join(location).replace(".[", "[")
    if detail["type"] == "enum":
        message += _enum_hint(detail)
    if detail["type"] == "extra_forbidden":
        if path in RENAMED_FIELDS:
            message = f"renamed to {RENAMED_FIELDS[path]} (CHANGELOG.md)"
        else:
            *parent, field = detail["loc"]
            message = unknown_field_message(str(field), parent, schema=_wire_schema())
    return FieldError(path=path, message=message)
