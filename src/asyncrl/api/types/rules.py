"""The cross-field rules of the spec, each declared once: as CEL for the API server, as a pydantic message.

The API server checks these at admission (`x-kubernetes-validations` in the generated CRD); the spec models'
validators check the same conditions in Python and raise the same messages, so local mode and `kubectl apply`
reject the same manifests for the same stated reason.
"""

from __future__ import annotations

import re
from typing import Any

from asyncrl.api.types.meta import CelRule
from asyncrl.api.types.verl_layout import DEFAULT_TOKEN_BUDGET

# Upper bounds that keep the numbers in the async rule's message exact (see _cel_decimal).
MAX_TRAIN_BATCH_SIZE = 100_000
MAX_WINDOW_SIZE = 2 * MAX_TRAIN_BATCH_SIZE


def _exactly_one_rule(owner: str, options: tuple[str, ...]) -> CelRule:
    count = " + ".join(f"(has(self.{option}) ? 1 : 0)" for option in options)
    listed = ", ".join(options[:-1]) + f" or {options[-1]}"
    return CelRule(rule=f"{count} == 1", message=f"{owner} needs exactly one of {listed}")


def check_exactly_one(rule: CelRule, given: dict[str, object]) -> None:
    """The pydantic side of an exactly-one rule: `given` maps each option's wire name to its value."""
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) != 1:
        raise ValueError(f"{rule.message} (given: {', '.join(chosen) or 'none'})")


DATA_SOURCE_RULE = _exactly_one_rule("data", ("inline", "configMapRef", "path"))
TEMPLATE_SOURCE_RULE = _exactly_one_rule("agents.template", ("configMapRef", "inline"))


def _cel_decimal(expression: str, *, max_value: int) -> str:
    """CEL for the decimal text of the int `expression` (0 <= value <= max_value), one digit per line.

    CEL's `string(int)` has an unbounded result size in the API server's cost estimate, so a message built
    with it is rejected as too expensive; digits cut from a constant string with `substring` are bounded.
    (`cel.bind` would shorten this, but CRD validation rules cannot use it.)
    """
    digits = []
    for power in reversed(range(len(str(max_value)))):
        scale = 10**power
        index = f"{expression} / {scale} % 10" if power else f"{expression} % 10"
        digit = f"'0123456789'.substring({index}, {index} + 1)"
        digits.append(f"({expression} >= {scale} ? {digit} : '')" if power else digit)
    body = " +\n".join(f"  {digit}" for digit in digits)
    return f"(\n{body}\n)"


_TRAIN = "self.trainBatchSize"
_WINDOW = "self.async.windowSize"
ASYNC_WINDOW_RULE = CelRule(
    rule=f"!has(self.async) || !self.async.enabled || (has({_WINDOW}) && {_WINDOW} > {_TRAIN})",
    # The same text as WindowConfig's error (the pydantic side); a test compares the two.
    message_expression="\n".join(
        (
            "'windowSize (' +",
            f"(has({_WINDOW}) ? {_cel_decimal(_WINDOW, max_value=MAX_WINDOW_SIZE)} : 'unset') +",
            "') must be greater than trainBatchSize (' +",
            f"{_cel_decimal(_TRAIN, max_value=MAX_TRAIN_BATCH_SIZE)} +",
            "') when async is enabled; try windowSize: ' +",
            f"{_cel_decimal(f'(2 * {_TRAIN})', max_value=MAX_WINDOW_SIZE)} +",
            "' (2 x trainBatchSize)'",
        )
    ),
    message=(
        "windowSize must be greater than trainBatchSize when async is enabled; "
        "try windowSize = 2 x trainBatchSize"
    ),
    field_path=".async.windowSize",
)

# verl splits each update's trainBatchSize x samplesPerPrompt rows evenly over its data-parallel ranks (one
# per GPU) and asserts that they divide (verl_layout.py has the exact rule, with overrides and suggestions).
# CEL cannot read verlOverrides (preserve-unknown-fields), which may change the mini-batch or the ranks
# (ppo_mini_batch_size, Ulysses), so admission checks the runs without overrides; validation covers all.
_GPUS = (
    "(has(self.trainer.gpusPerNode) ? self.trainer.gpusPerNode : self.trainer.gpus) * "
    "(has(self.trainer.nodes) ? self.trainer.nodes : 1)"
)
VERL_MINI_BATCH_RULE = CelRule(
    rule=(
        "!has(self.trainer) || (has(self.trainer.backend) && self.trainer.backend != 'Verl') || "
        f"has(self.trainer.verlOverrides) || {_GPUS} < 1 || "
        f"(self.trainBatchSize * self.rollout.samplesPerPrompt) % ({_GPUS}) == 0"
    ),
    message=(
        "with the Verl backend, trainBatchSize x rollout.samplesPerPrompt (the rows of an update) must "
        "divide evenly by the trainer's GPUs (trainer.gpus, or trainer.gpusPerNode x trainer.nodes), or "
        "verl's first update fails on an assertion; `asyncrl validate` names values that work"
    ),
    field_path=".trainBatchSize",
)

# verl's token budget per micro-batch (16384 unless verlOverrides changes it) must hold the longest row.
VERL_TOKEN_BUDGET_RULE = CelRule(
    rule=(
        "!has(self.trainer) || (has(self.trainer.backend) && self.trainer.backend != 'Verl') || "
        "has(self.trainer.verlOverrides) || "
        f"self.data.maxPromptLength + self.data.maxResponseLength <= {DEFAULT_TOKEN_BUDGET}"
    ),
    message=(
        "with the Verl backend, data.maxPromptLength + data.maxResponseLength (the longest row) must fit "
        f"verl's token budget per micro-batch ({DEFAULT_TOKEN_BUDGET}), or its first update fails on an "
        "assertion: lower the lengths, or raise actor_rollout_ref.actor.ppo_max_token_len_per_gpu in "
        "trainer.verlOverrides"
    ),
    field_path=".data.maxPromptLength",
)

# A Ray cluster of more than one node writes each checkpoint from every node (each rank saves its shard), so
# all of them must mount the same volume: a claim the head and every worker pod mount (ReadWriteMany; the
# operator checks the claim's access modes, which CEL cannot see).
MULTI_NODE_CHECKPOINT_RULE = CelRule(
    rule="!has(self.nodes) || self.nodes <= 1 || (has(self.checkpoint) && has(self.checkpoint.claimName))",
    message=(
        "trainer.nodes > 1 needs trainer.checkpoint.claimName: a ReadWriteMany PersistentVolumeClaim that "
        "the Ray head and every worker pod mount (each node writes its shard of a checkpoint); create one "
        "(NFS, CephFS, a cloud file store) and name it there, or set trainer.nodes: 1"
    ),
    field_path=".checkpoint.claimName",
)
MULTI_NODE_BACKEND_RULE = CelRule(
    rule="!has(self.nodes) || self.nodes <= 1 || !has(self.backend) || self.backend == 'Verl'",
    message=(
        "trainer.nodes > 1 needs trainer.backend: Verl (the Reference backend trains in one process on "
        "one node); set trainer.nodes: 1 for the Reference backend"
    ),
    field_path=".nodes",
)

# The head pod of a multi-node run holds Ray beside the gateway: its fixed ports (GCS, KubeRay's metrics
# export, the dashboard, the Ray client and worker range, the dashboard agent) are not the gateway's to take.
RAY_HEAD_PORTS = (6379, 8080, 8265, 52365)
RAY_HEAD_PORT_RANGE = (10001, 19999)
_GATEWAY_PORT = "self.gateway.port"
MULTI_NODE_GATEWAY_PORT_RULE = CelRule(
    rule=(
        "!has(self.trainer) || !has(self.trainer.nodes) || self.trainer.nodes <= 1 || !has(self.gateway) || "
        f"!has({_GATEWAY_PORT}) || !({_GATEWAY_PORT} in {list(RAY_HEAD_PORTS)} || "
        f"({_GATEWAY_PORT} >= {RAY_HEAD_PORT_RANGE[0]} && {_GATEWAY_PORT} <= {RAY_HEAD_PORT_RANGE[1]}))"
    ),
    message=(
        "with trainer.nodes > 1 the gateway shares the Ray head pod, whose ports "
        f"{', '.join(map(str, RAY_HEAD_PORTS))} and {RAY_HEAD_PORT_RANGE[0]}-{RAY_HEAD_PORT_RANGE[1]} are "
        "Ray's; pick another gateway.port (the default 8090 is free)"
    ),
    field_path=".gateway.port",
)


def gateway_port_taken_by_ray(port: int) -> bool:
    return port in RAY_HEAD_PORTS or RAY_HEAD_PORT_RANGE[0] <= port <= RAY_HEAD_PORT_RANGE[1]


# The fields a running run applies, with the effect of an edit (the CRD reference lists them). Every other
# field is immutable (IMMUTABLE_FIELDS), so that no edit is silently ignored: the trainer and the gateway read
# theirs once, when their pod starts.
MUTABLE_FIELDS: dict[str, str] = {
    "suspend": "true: no new agent Jobs and the trainer is suspended (its pod ends); false: both resume",
    "agents.maxJobsPerMinute": "the launch rate, at once",
    "agents.maxActiveJobs": "the cap on active agent Jobs, from the next launch (running Jobs are kept)",
    "agents.template": "rollouts not yet launched get the new template; launched ones keep theirs",
    "agents.ttlSecondsAfterFinished": "agent Jobs launched from now on",
    "agents.pool.replicas": "the agent pool is resized (agents.mode Pool)",
}

# Fields that define what a run trains, or that its trainer and gateway read once at start: changing them
# would make its checkpoints and metrics meaningless, or would be ignored until some later restart.
IMMUTABLE_FIELDS = (
    "model",
    "trainBatchSize",
    "rollout.samplesPerPrompt",
    "trainer.backend",
    "trainer.nodes",
    "async.enabled",
    "async.windowSize",
    "agents.mode",  # Jobs and Pool launch differently; a switch mid-run would strand the other's agents
    # Whole sections read by the trainer pod (the finer paths above keep their precise messages):
    "data",
    "rollout",
    "rolloutTimeoutSeconds",
    "totalSteps",
    "maxFailedSteps",
    "async",
    "rolloutCorrection",
    "trainer",
    "gateway",
    "logging",
)
# Immutable fields that may be absent; the others are required or defaulted by the API server.
_OPTIONAL_IMMUTABLE_FIELDS = frozenset(
    {
        "async.windowSize",
        "data",
        "rollout",
        "rolloutTimeoutSeconds",
        "totalSteps",
        "maxFailedSteps",
        "async",
        "rolloutCorrection",
        "trainer",
        "gateway",
        "logging",
    }
)


def immutable_message(path: str) -> str:
    return f"{path} cannot change after the run is created; create a new AsyncTrainingRun instead"


def _immutable_rule(path: str) -> CelRule:
    new, old = f"self.{path}", f"oldSelf.{path}"
    if path in _OPTIONAL_IMMUTABLE_FIELDS:
        rule = f"has({new}) == has({old}) && (!has({new}) || {new} == {old})"
    else:
        rule = f"{new} == {old}"
    return CelRule(rule=rule, message=immutable_message(path), field_path=f".{path}")


def immutable_rules() -> tuple[CelRule, ...]:
    """The transition rules (`self == oldSelf`) of IMMUTABLE_FIELDS, for the spec object."""
    return tuple(_immutable_rule(path) for path in IMMUTABLE_FIELDS)


# A run's name becomes label values (63 characters at most) and the prefix of its Service's name (a DNS-1035
# label: lowercase letters, digits and '-', starting with a letter). Refused at admission, not after.
MAX_RUN_NAME_LENGTH = 63
RUN_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
RUN_NAME_RULE = CelRule(
    rule=(
        f"!has(self.metadata.name) || (self.metadata.name.size() <= {MAX_RUN_NAME_LENGTH} && "
        f"self.metadata.name.matches('{RUN_NAME_PATTERN}'))"
    ),
    message=(
        f"metadata.name must be at most {MAX_RUN_NAME_LENGTH} characters of lowercase letters, digits and "
        "'-', starting with a letter and ending with a letter or digit (it names the run's Service and "
        "labels), e.g. my-run-1"
    ),
)


def check_run_name(name: str) -> None:
    """The pydantic side of RUN_NAME_RULE."""
    if len(name) > MAX_RUN_NAME_LENGTH or not re.match(RUN_NAME_PATTERN, name):
        raise ValueError(f"{RUN_NAME_RULE.message} (given: {name!r})")


# A container's quantities the API server refuses only when the operator creates the pod (a 422 at run time):
# a negative one, and a limit below the request of the same resource. CEL's Kubernetes quantity library
# (isQuantity, quantity, isLessThan, compareTo) checks them at admission; the maps are bounded (MAX_RESOURCES)
# so that the rule's estimated cost stays within the API server's budget.
MAX_RESOURCES = 32
_QUANTITY_OF = "quantity(string({map}[k]))"
_IS_QUANTITY = "isQuantity(string({map}[k]))"


def _non_negative(map_name: str) -> str:
    where = f"self.{map_name}"
    return (
        f"(!has({where}) || {where}.all(k, !{_IS_QUANTITY.format(map=where)} || "
        f"!{_QUANTITY_OF.format(map=where)}.isLessThan(quantity('0'))))"
    )


RESOURCE_QUANTITY_RULE = CelRule(
    rule=f"{_non_negative('limits')} && {_non_negative('requests')}",
    message="a resource quantity is negative; write 0 or more (e.g. cpu: 500m, memory: 512Mi)",
)
RESOURCE_LIMIT_RULE = CelRule(
    rule=(
        "!has(self.limits) || !has(self.requests) || self.requests.all(k, !(k in self.limits) || "
        "!isQuantity(string(self.limits[k])) || !isQuantity(string(self.requests[k])) || "
        "quantity(string(self.limits[k])).compareTo(quantity(string(self.requests[k]))) >= 0)"
    ),
    message="a limit is below the request of the same resource; raise the limit or lower the request",
    field_path=".limits",
)


# Label maps (the trainer pod's labels, its nodeSelector): keys and values the API server takes, checked at
# admission so that a bad one is refused at `kubectl apply`, not with a 422 on the trainer Job. Keys: an
# optional DNS-subdomain prefix and '/', then a name of at most 63 characters; values: at most 63. The
# maps are bounded (MAX_LABELS) so that the rules' estimated cost stays within the API server's budget.
MAX_LABELS = 64
MAX_LABEL_KEY_LENGTH = 253 + 1 + 63
_LABEL_NAME_RE = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN_RE = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY_PATTERN = f"^({_DNS_SUBDOMAIN_RE}/)?{_LABEL_NAME_RE}$"
LABEL_VALUE_PATTERN = f"^({_LABEL_NAME_RE})?$"
# A label map's values, in the CRD's schema (the API server checks them at admission).
LABEL_VALUES_SCHEMA: dict[str, Any] = {
    "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
}


def label_map_rule(field: str, what: str) -> CelRule:
    """`self.<field>`'s keys are label keys (CEL); its values are checked by the schema's pattern."""
    return CelRule(
        rule=(
            f"!has(self.{field}) || self.{field}.all(k, size(k) <= {MAX_LABEL_KEY_LENGTH} && "
            f"k.matches('{LABEL_KEY_PATTERN}'))"
        ),
        message=(
            f"{what}: a key is not a label key (an optional DNS prefix and '/', then 1 to 63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit), e.g. example.com/team"
        ),
        field_path=f".{field}",
    )
