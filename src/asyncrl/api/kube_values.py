"""Kubernetes' own rules for label keys and values and for resource quantities, checked before apply.

The API server refuses a pod (or a Job) whose label key is not a qualified name, whose label value is not a
DNS label-like value, whose quantity is negative, or whose limit is below its request. These values reach
the API server only when the operator creates a child (the trainer Job, every agent Job), so without this
module they pass `kubectl apply` and `asyncrl validate` and fail at run time with a 422. The rules are those
of `k8s.io/apimachinery/pkg/util/validation` (IsQualifiedName, IsValidLabelValue) and of
`resource.Quantity`; each message names what is wrong and how to write it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

MAX_LABEL_NAME_LENGTH = 63  # a label value, and the name part of a key
MAX_LABEL_PREFIX_LENGTH = 253  # the DNS subdomain before the '/' of a key
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_RULE = "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"


def label_key_problem(key: str) -> str | None:
    """Why `key` cannot be a label (or annotation, nodeSelector) key; None when it can."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return f"label key {key!r}: the prefix before '/' is empty"
    if prefix and (len(prefix) > MAX_LABEL_PREFIX_LENGTH or not _DNS_SUBDOMAIN.match(prefix)):
        return (
            f"label key {key!r}: the prefix {prefix!r} must be a DNS subdomain (lowercase letters, digits, "
            f"'-' and '.', at most {MAX_LABEL_PREFIX_LENGTH} characters), e.g. example.com/team"
        )
    if len(name) > MAX_LABEL_NAME_LENGTH or not _LABEL_NAME.match(name):
        return (
            f"label key {key!r}: the name {name!r} must be 1 to {MAX_LABEL_NAME_LENGTH} {_NAME_RULE}, "
            "after an optional DNS prefix and '/' (e.g. app.kubernetes.io/part-of)"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` cannot be a label value; None when it can (the empty string can)."""
    if value == "":
        return None
    if len(value) > MAX_LABEL_NAME_LENGTH or not _LABEL_NAME.match(value):
        return f"label value {value!r} must be at most {MAX_LABEL_NAME_LENGTH} {_NAME_RULE}"
    return None


def label_problems(labels: Mapping[str, object]) -> dict[str, str]:
    """Each label key of `labels` that the API server refuses, with the reason (keys and values alike)."""
    problems: dict[str, str] = {}
    for key, value in labels.items():
        problem = label_key_problem(str(key))
        if problem is None and isinstance(value, str):
            problem = label_value_problem(value)
        if problem is not None:
            problems[str(key)] = problem
    return problems


_SUFFIXES = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def parse_quantity(text: object) -> Decimal | None:
    """The value of a Kubernetes quantity (`500m`, `64Gi`, `1e3`, 8); None when it is not one."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        return None
    match = _QUANTITY.match(str(text))
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIXES[suffix]
    except InvalidOperation:
        return None


def resource_problems(
    limits: Mapping[str, object] | None, requests: Mapping[str, object] | None
) -> dict[str, str]:
    """What the API server refuses in a container's resources: a path below `resources` → the reason.

    A quantity that does not parse, a negative one, and a limit below the request of the same resource."""
    problems: dict[str, str] = {}
    given = {"limits": limits or {}, "requests": requests or {}}
    values: dict[str, dict[str, Decimal]] = {"limits": {}, "requests": {}}
    for kind, quantities in given.items():
        for name, text in quantities.items():
            value = parse_quantity(text)
            if value is None:
                problems[f"{kind}.{name}"] = (
                    f"{text!r} is not a quantity; write e.g. 500m or 2 (cpu), 512Mi or 4Gi (memory)"
                )
            elif value < 0:
                problems[f"{kind}.{name}"] = f"{text!r} is negative; a quantity must be 0 or more"
            else:
                values[kind][str(name)] = value
    for name, request in values["requests"].items():
        limit = values["limits"].get(name)
        if limit is not None and limit < request:
            problems[f"limits.{name}"] = (
                f"the limit {given['limits'][name]!r} is below the request {given['requests'][name]!r} of "
                f"{name}; the API server refuses the pod: raise the limit or lower the request"
            )
    return problems
