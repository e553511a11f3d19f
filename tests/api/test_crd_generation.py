"""The committed CRD is exactly what the API types generate, and it is a structural schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from asyncrl.api import crd
from asyncrl.api.schema import SchemaError, structural_schema
from asyncrl.api.types import IMMUTABLE_FIELDS

FORBIDDEN_KEYWORDS = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const", "nullable"}


def _committed() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(crd.default_path().read_text())
    return loaded


def _version(document: dict[str, Any]) -> dict[str, Any]:
    (version,) = document["spec"]["versions"]
    assert isinstance(version, dict)
    return version


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below (and including) `node`, with its path."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


SCHEMA = _version(_committed())["schema"]["openAPIV3Schema"]


def test_committed_crd_is_the_generated_one() -> None:
    diff = crd.check(crd.default_path())
    assert not diff, f"crds/ is stale; run `{crd.REGENERATE_COMMAND}`\n" + "".join(diff[:60])


def test_committed_reference_docs_are_the_generated_ones() -> None:
    diff = crd.check(crd.default_docs_path(), crd.render_docs())
    assert not diff, f"docs/crd-reference.md is stale; run `{crd.REGENERATE_COMMAND}`\n" + "".join(diff[:60])


def test_generation_is_deterministic() -> None:
    assert crd.render() == crd.render()
    assert crd.render().startswith("# Generated from the pydantic API types")
    assert crd.REGENERATE_COMMAND in crd.render().splitlines()[1]


def test_the_committed_yaml_reads_back_as_the_generated_object() -> None:
    assert _committed() == crd.crd()


def test_check_reports_a_stale_file_with_the_command_that_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale, docs = tmp_path / "crd.yaml", tmp_path / "docs.md"
    stale.write_text(crd.render().replace("default: 8090", "default: 8091"))
    docs.write_text(crd.render_docs())
    paths = ["--path", str(stale), "--docs-path", str(docs)]

    assert crd.main(["--check", *paths]) == 1
    out = capsys.readouterr()
    assert re.search(r"^-\s+default: 8091$", out.out, re.MULTILINE)  # the diff shows the stale line
    assert crd.REGENERATE_COMMAND in out.err

    assert crd.main(["--write", *paths]) == 0
    assert crd.main(["--check", *paths]) == 0
    assert stale.read_text() == crd.render()


def test_names_scope_and_status_subresource() -> None:
    document = _committed()
    assert document["metadata"]["name"] == "asynctrainingruns.asyncrl.dev"
    assert document["spec"]["group"] == "asyncrl.dev"
    assert document["spec"]["scope"] == "Namespaced"
    assert document["spec"]["names"] == {
        "kind": "AsyncTrainingRun",
        "listKind": "AsyncTrainingRunList",
        "plural": "asynctrainingruns",
        "singular": "asynctrainingrun",
        "shortNames": ["atr"],
        "categories": ["asyncrl"],
    }
    version = _version(document)
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = [
        (column["name"].upper(), column["jsonPath"], column.get("priority", 0))
        for column in _version(_committed())["additionalPrinterColumns"]
    ]
    assert columns == [
        ("PHASE", ".status.phase", 0),
        ("STEPS", ".status.progress", 0),
        ("REWARD", ".status.reward.last", 0),
        ("BEST", ".status.reward.best", 1),
        ("ACTIVE", ".status.activeGroups", 0),
        ("CARRY-OVER", ".status.newCarryOverRollouts", 0),
        ("MAX-AGE", ".status.carryOverAgeMaxSteps", 0),
        ("DRAIN", ".status.proxyDrainSeconds", 0),
        ("SUCCEEDED", ".status.rollouts.succeeded", 1),
        ("FAILED", ".status.rollouts.failed", 1),
        ("JOBS", ".status.jobs.active", 1),
        ("AGE", ".metadata.creationTimestamp", 0),
    ]


def test_schema_is_structural() -> None:
    for path, node in _nodes(SCHEMA):
        if node.get("x-kubernetes-int-or-string"):  # the one allowed union: a resource quantity
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        assert not FORBIDDEN_KEYWORDS & node.keys(), path
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: OpenAPI v3.0 {bound} is a boolean"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert node["type"] == "object", path
            # Free-form, except the keys it is merged by (a volume's name), which the server requires.
            assert set(node.get("properties", {})) <= set(node.get("required", [])), path
    assert SCHEMA["properties"]["metadata"] == {"type": "object"}


def test_every_field_has_a_description() -> None:
    fields = [(path, node) for path, node in _nodes(SCHEMA) if not path.endswith(("[]", "{}"))]
    missing = [path for path, node in fields if path != ".metadata" and not node.get("description")]
    assert missing == []


def test_defaults_have_the_type_of_their_field() -> None:
    python_type = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}
    for path, node in _nodes(SCHEMA):
        if "default" not in node:
            continue
        default = node["default"]
        if node["type"] == "number":
            assert type(default) in (int, float), path
        else:
            assert type(default) is python_type[node["type"]], path
        if "enum" in node:
            assert default in node["enum"], path


def test_free_form_objects_preserve_unknown_fields() -> None:
    spec = SCHEMA["properties"]["spec"]["properties"]
    assert spec["trainer"]["properties"]["verlOverrides"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["data"]["properties"]["inline"]["items"]["x-kubernetes-preserve-unknown-fields"] is True


def test_resource_quantities_are_int_or_string_in_quantity_syntax() -> None:
    resources = SCHEMA["properties"]["spec"]["properties"]["trainer"]["properties"]["resources"]
    for section in ("limits", "requests"):
        quantity = resources["properties"][section]["additionalProperties"]
        assert quantity["x-kubernetes-int-or-string"] is True
        assert quantity["pattern"].startswith("^(\\+|-)?")


def test_run_names_that_cannot_name_children_are_refused_at_admission() -> None:
    (rule,) = SCHEMA["x-kubernetes-validations"]
    assert "self.metadata.name.size() <= 63" in rule["rule"]
    assert "metadata.name" in rule["message"]


def test_async_rule_is_enforced_at_admission_with_its_advice() -> None:
    rules = SCHEMA["properties"]["spec"]["x-kubernetes-validations"]
    (window,) = [
        rule
        for rule in rules
        if rule.get("fieldPath") == ".async.windowSize" and "oldSelf" not in rule["rule"]
    ]
    assert window["rule"] == (
        "!has(self.async) || !self.async.enabled || "
        "(has(self.async.windowSize) && self.async.windowSize > self.trainBatchSize)"
    )
    assert "2 x trainBatchSize" in window["message"]
    assert "(2 x trainBatchSize)" in window["messageExpression"]


def test_every_immutable_field_has_a_transition_rule() -> None:
    rules = SCHEMA["properties"]["spec"]["x-kubernetes-validations"]
    transition = {rule["fieldPath"]: rule for rule in rules if "oldSelf" in rule["rule"]}
    assert sorted(transition) == sorted(f".{path}" for path in IMMUTABLE_FIELDS)
    for path, rule in transition.items():
        assert "create a new AsyncTrainingRun" in rule["message"], path


def test_yaml_1_1_readers_see_no_boolean_key() -> None:
    """kubectl and Helm read YAML 1.1, where a bare `n` is the boolean false."""

    class Yaml11Loader(yaml.SafeLoader):
        pass

    Yaml11Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
    as_kubectl_reads_it = yaml.load(crd.default_path().read_text(), Loader=Yaml11Loader)

    rollout = _version(as_kubectl_reads_it)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "rollout"
    ]
    assert list(rollout["properties"]) == ["dropUniformGroups", "samplesPerPrompt"]

    def keys(node: object) -> list[object]:
        if isinstance(node, dict):
            return [*node, *(key for value in node.values() for key in keys(value))]
        if isinstance(node, list):
            return [key for item in node for key in keys(item)]
        return []

    assert not [key for key in keys(as_kubectl_reads_it) if isinstance(key, bool)]


def test_unions_without_a_structural_form_are_refused() -> None:
    class IntOrText(BaseModel):
        value: int | str = Field(description="Either.")

    with pytest.raises(SchemaError, match="unions"):
        structural_schema(IntOrText)
