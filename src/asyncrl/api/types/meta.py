"""What every AsyncTrainingRun type shares: the API's names, the wire conventions and the CEL rule record.

The pydantic models in this package are the single source of the API: the CRD in `crds/` is generated from
them, so a rule that the API server enforces with CEL is declared here, next to the pydantic validator that
mirrors it for local mode, and both quote the same message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "asyncrl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AsyncTrainingRun"
LIST_KIND = f"{KIND}List"
PLURAL = "asynctrainingruns"
SINGULAR = "asynctrainingrun"
SHORT_NAMES = ("atr",)
CATEGORIES = ("asyncrl",)
CRD_NAME = f"{PLURAL}.{GROUP}"

VALIDATIONS_KEY = "x-kubernetes-validations"


class ApiModel(BaseModel):
    """Base of every spec and status object: camelCase on the wire, snake_case in Python, no unknown keys.

    Unknown keys are errors (not silently dropped) so that local mode rejects typos as `kubectl apply`'s
    strict field validation does.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
    )

    def to_wire(self) -> dict[str, Any]:
        """This object as the API server stores it: camelCase keys, JSON values, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class FieldRuleError(ValueError):
    """A cross-field rule failed; `field_path` (wire names, below the validated object) is where it points.

    Pydantic reports a model validator's error at the model; the field path lets `load_run` name the same
    field the API server names through the CEL rule's `fieldPath`.
    """

    def __init__(self, message: str, *, field_path: tuple[str, ...]) -> None:
        super().__init__(message)
        self.field_path = field_path


@dataclass(frozen=True, kw_only=True)
class CelRule:
    """One `x-kubernetes-validations` entry; `message` is also what the pydantic mirror of the rule raises."""

    rule: str
    message: str
    message_expression: str | None = None
    field_path: str | None = None  # e.g. ".async.windowSize", relative to the object holding the rule

    def schema(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.message_expression is not None:
            entry["messageExpression"] = self.message_expression
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        return entry


def cel_rules(*rules: CelRule) -> dict[str, Any]:
    """The `json_schema_extra` that attaches CEL rules to a model or a field."""
    return {VALIDATIONS_KEY: [rule.schema() for rule in rules]}


def section(factory: type[ApiModel], description: str) -> Any:
    """A nested object that may be omitted: pydantic builds it from its defaults, the API server from `{}`.

    The CRD default `{}` makes the server fill the nested defaults too, so a stored run shows every default
    that pydantic would apply.
    """
    return Field(default_factory=factory, description=description, json_schema_extra={"default": {}})
