"""The spec of an AsyncTrainingRun: the user's intent, one model per section of the manifest.

Every field's description becomes the CRD's field description and the reference docs, so it is written for
the person filling in the manifest. The cross-field rules come from `asyncrl.api.types.rules`: attached here
as CEL for the API server, and checked by the validators beside them with the same message, so a manifest
that `kubectl apply` rejects is rejected by local mode too. Scalars are strict (`strict=True`) for the same
reason: the API server's schema does not read `"yes"` as a boolean or `"4"` as an integer, so neither does
local mode.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from asyncrl.api.kube_values import label_key_problem, label_problems, resource_problems
from asyncrl.api.types.meta import ApiModel, FieldRuleError, cel_rules, section
from asyncrl.api.types.rules import (
    ASYNC_WINDOW_RULE,
    DATA_SOURCE_RULE,
    LABEL_VALUES_SCHEMA,
    MAX_LABELS,
    MAX_RESOURCES,
    MAX_TRAIN_BATCH_SIZE,
    MAX_WINDOW_SIZE,
    MULTI_NODE_BACKEND_RULE,
    MULTI_NODE_CHECKPOINT_RULE,
    MULTI_NODE_GATEWAY_PORT_RULE,
    RESOURCE_LIMIT_RULE,
    RESOURCE_QUANTITY_RULE,
    TEMPLATE_SOURCE_RULE,
    VERL_MINI_BATCH_RULE,
    VERL_TOKEN_BUDGET_RULE,
    check_exactly_one,
    gateway_port_taken_by_ray,
    immutable_rules,
    label_map_rule,
)
from asyncrl.api.types.tool_call_parsers import (
    DEFAULT_TOOL_CALL_PARSER,
    TOOL_CALL_PARSER_VALUES,
    check_tool_call_parser,
)
from asyncrl.api.types.verl_layout import (
    DEFAULT_MAX_PROMPT_LENGTH,
    DEFAULT_MAX_RESPONSE_LENGTH,
    VerlLayout,
    layout_errors,
)
from asyncrl.api.types.verl_overrides import flatten_overrides, learning_rate_errors, owned_key_errors
from asyncrl.capturing import DEFAULT_MAX_CAPTURE_BYTES, DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT, CaptureMode
from asyncrl.pause_modes import DrainPolicy, PauseMode
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy, rollout_sampling_of
from asyncrl.window_config import StalenessPolicy, WindowConfig


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the run's namespace."""

    name: str = Field(min_length=1, description="Name of the ConfigMap.")
    key: str = Field(min_length=1, description="Key in the ConfigMap's data that holds the file.")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the run's namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(min_length=1, description="Key in the Secret's data.")


class GatewayKeySecretRef(SecretKeyRef):
    """The Secret key holding the gateway key from which agents' tokens are derived."""

    key: str = Field(default="key", min_length=1, description="Key in the Secret's data.")


# Kubernetes' own quantity syntax (resource.Quantity): what `kubectl` accepts in limits and requests.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity_text(value: object) -> object:
    """A YAML number (`nvidia.com/gpu: 1`) as the string the Kubernetes API and its client take."""
    if isinstance(value, bool):
        return value  # refused by the str type below, not read as 1
    if isinstance(value, int | float):
        return format(value, "g") if isinstance(value, float) else str(value)
    return value


MAX_QUANTITY_LENGTH = 64

Quantity = Annotated[
    str,
    BeforeValidator(_quantity_text),
    Field(pattern=QUANTITY_PATTERN, max_length=MAX_QUANTITY_LENGTH),
    # The API server's own form of a quantity: an integer or a string in quantity syntax.
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": MAX_QUANTITY_LENGTH,  # bounds the CEL quantity rules' estimated cost
            "x-kubernetes-int-or-string": True,
        }
    ),
]


class ResourceRequirements(ApiModel):
    """Compute resources of a container, as in a pod spec; quantities like `8`, `500m`, `64Gi`."""

    model_config = ConfigDict(json_schema_extra=cel_rules(RESOURCE_QUANTITY_RULE, RESOURCE_LIMIT_RULE))

    limits: dict[str, Quantity] | None = Field(
        default=None,
        max_length=MAX_RESOURCES,
        description="Most of each resource the container may use (e.g. memory: 64Gi).",
    )
    requests: dict[str, Quantity] | None = Field(
        default=None,
        max_length=MAX_RESOURCES,
        description="Resources the scheduler reserves for the container (e.g. cpu: 8).",
    )

    @model_validator(mode="after")
    def _quantities_the_api_server_takes(self) -> Self:
        """RESOURCE_QUANTITY_RULE and RESOURCE_LIMIT_RULE: the API server would refuse the pod (422)."""
        problems = resource_problems(self.limits, self.requests)
        if problems:
            first = next(iter(problems))
            raise FieldRuleError("; ".join(problems.values()), field_path=tuple(first.split(".", 1)))
        return self


# Pod Security Standards' `restricted` profile for a container: the trainer's and gateway's default, so that
# a run starts in a namespace that enforces it (both images run as the numeric non-root user 10001).
RESTRICTED_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

DEFAULT_GATEWAY_REQUESTS: dict[str, Any] = {"cpu": "500m", "memory": "512Mi"}

_FREE_FORM = "free-form: the API server validates it when the operator creates the trainer Job"


class NamedObject(BaseModel):
    """A Kubernetes list entry keyed by `name` (a volume, an env var); its other fields are passed through."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="Name of the entry.")


class VolumeMount(BaseModel):
    """A container's volumeMount; its other fields (readOnly, subPath, ...) are passed through."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="Name of the pod volume to mount.")
    mount_path: str = Field(
        alias="mountPath", min_length=1, description="Path in the container where the volume appears."
    )


class PodTemplateMetadata(ApiModel):
    """Labels and annotations added to the trainer pod (not to the Job)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(label_map_rule("labels", "the trainer pod's labels"))
    )

    labels: dict[str, str] | None = Field(
        default=None,
        max_length=MAX_LABELS,
        description="Labels of the trainer pod; the operator's own keys (app.kubernetes.io/*, "
        "asyncrl.dev/run) keep the operator's values.",
        json_schema_extra=LABEL_VALUES_SCHEMA,
    )
    annotations: dict[str, str] | None = Field(default=None, description="Annotations of the trainer pod.")

    @field_validator("labels")
    @classmethod
    def _valid_labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _checked_labels(value)

    @field_validator("annotations")
    @classmethod
    def _valid_annotation_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            problem = label_key_problem(key)
            if problem is not None:
                raise FieldRuleError(problem.replace("label key", "annotation key"), field_path=(key,))
        return value


def _checked_labels(value: dict[str, str] | None) -> dict[str, str] | None:
    """Label keys and values the API server takes (a 422 for the trainer Job otherwise)."""
    problems = label_problems(value or {})
    if problems:
        first = next(iter(problems))
        raise FieldRuleError("; ".join(problems.values()), field_path=(first,))
    return value


class TrainerContainerTemplate(ApiModel):
    """Additions to the trainer container: environment, mounts of the template's volumes, security context."""

    env: list[NamedObject] | None = Field(
        default=None,
        description=(
            f"Environment variables (corev1 EnvVar: name, value or valueFrom), {_FREE_FORM}; the operator's "
            "own variables (ASYNCRL_GATEWAY_KEY, WANDB_*) keep the operator's values."
        ),
    )
    env_from: list[dict[str, Any]] | None = Field(
        default=None,
        description=f"Variables from ConfigMaps or Secrets (corev1 EnvFromSource), {_FREE_FORM}.",
    )
    volume_mounts: list[VolumeMount] | None = Field(
        default=None,
        description=(
            f"Mounts of `volumes` (corev1 VolumeMount: name, mountPath, readOnly, subPath), {_FREE_FORM}; "
            "the operator's own mount paths (its config, checkpoints, data, /dev/shm) are kept."
        ),
    )
    security_context: dict[str, Any] | None = Field(
        default=None,
        description=(
            f"corev1 SecurityContext of the trainer container, {_FREE_FORM}; its keys replace those of the "
            "default, which meets Pod Security `restricted` (runAsNonRoot, allowPrivilegeEscalation: false, "
            "capabilities drop ALL, seccompProfile RuntimeDefault)."
        ),
    )


class TrainerPodTemplate(ApiModel):
    """What the user adds to the trainer pod: scheduling, identity, volumes, the trainer container's env.

    The operator owns the rest (containers, the gateway sidecar, restartPolicy, its own labels, volumes,
    mounts and variables); a field of this template that collides with one of those is refused and reported.
    """

    model_config = ConfigDict(
        json_schema_extra=cel_rules(label_map_rule("nodeSelector", "the trainer pod's nodeSelector"))
    )

    metadata: PodTemplateMetadata | None = Field(
        default=None, description="Labels and annotations of the trainer pod."
    )
    node_selector: dict[str, str] | None = Field(
        default=None,
        max_length=MAX_LABELS,
        description="Node labels the trainer pod must be scheduled on (e.g. a GPU type).",
        json_schema_extra=LABEL_VALUES_SCHEMA,
    )

    @field_validator("node_selector")
    @classmethod
    def _valid_node_labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _checked_labels(value)

    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        description=f"corev1 Tolerations of the trainer pod (e.g. of GPU node taints), {_FREE_FORM}.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description=f"corev1 Affinity of the trainer pod, {_FREE_FORM}."
    )
    priority_class_name: str | None = Field(
        default=None, min_length=1, description="PriorityClass of the trainer pod."
    )
    service_account_name: str | None = Field(
        default=None,
        min_length=1,
        description="Service account of the trainer pod (e.g. for cloud storage access); unset: default.",
    )
    security_context: dict[str, Any] | None = Field(
        default=None,
        description=(
            f"corev1 PodSecurityContext of the trainer pod (e.g. fsGroup, so a volume is writable by the "
            f"images' user 10001), {_FREE_FORM}."
        ),
    )
    volumes: list[NamedObject] | None = Field(
        default=None,
        description=(
            f"corev1 Volumes of the trainer pod (a PVC holding the model, a Secret), {_FREE_FORM}; mount "
            "them with trainerContainer.volumeMounts. The operator's own volume names (config, gateway-key, "
            "checkpoints, data, dshm) are refused."
        ),
    )
    trainer_container: TrainerContainerTemplate | None = Field(
        default=None, description="Additions to the trainer container."
    )


class ModelSpec(ApiModel):
    """The policy model that is served to agents and trained."""

    name: str = Field(
        min_length=1, description="Served model name: the `model` agents send in their OpenAI requests."
    )
    path: str = Field(
        min_length=1,
        description=(
            "Hugging Face repo id, or a path in the trainer container: on a volume of "
            "trainer.podTemplate.volumes mounted with trainer.podTemplate.trainerContainer.volumeMounts."
        ),
    )
    tool_call_parser: str = Field(
        strict=True,
        default=DEFAULT_TOOL_CALL_PARSER,
        json_schema_extra={"enum": list(TOOL_CALL_PARSER_VALUES)},
        description=(
            "vLLM's tool-call parser (its --tool-call-parser, with --enable-auto-tool-choice): it turns the "
            "tool calls the model writes into the `tool_calls` of the answer to a call with `tools`. It must "
            "match the format the model's chat template teaches: `hermes` for Qwen2.5, Qwen3, QwQ and Hermes "
            "models, `llama3_json` for Llama 3.1-3.3, `mistral` for Mistral, `qwen3_coder` for Qwen3-Coder "
            "(docs/writing-an-agent.md#tools). `Disabled`: vLLM answers 400 to calls with `tools` unless "
            "their tool_choice is none. The Reference backend ignores it."
        ),
    )

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_call_parser(cls, value: str) -> str:
        return check_tool_call_parser(value)


class DataSpec(ApiModel):
    """The prompts: one row per prompt group; a row's value becomes each of the group's rollouts' `input`."""

    model_config = ConfigDict(json_schema_extra=cel_rules(DATA_SOURCE_RULE))

    inline: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        description="Rows written in the manifest; each row's value becomes each rollout's `input`.",
    )
    config_map_ref: ConfigMapKeyRef | None = Field(
        default=None,
        description=(
            "A ConfigMap key holding a file of rows: JSON lines, a JSON array, or parquet (in binaryData)."
        ),
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "A file of rows in the trainer container, on a volume of trainer.podTemplate.volumes mounted "
            "with trainer.podTemplate.trainerContainer.volumeMounts: JSON lines, a JSON array or parquet "
            "(told by its content, not its name), or a folder of *.parquet files. A parquet row is an "
            "object of its columns; nested columns (verl's prompt messages, reward_model) become JSON."
        ),
    )
    shuffle: bool = Field(
        strict=True, default=True, description="Shuffle the rows before each pass over the data."
    )
    seed: int = Field(strict=True, default=0, ge=0, description="Seed of the shuffle.")
    max_prompt_length: int = Field(
        strict=True,
        default=DEFAULT_MAX_PROMPT_LENGTH,
        ge=1,
        description=(
            "Tokens of a training row's prompt (the conversation before the first trained token) at most: a "
            "longer one drops its row (counted in training/adapter/dropped_long_prompt). verl's "
            "data.max_prompt_length; with maxResponseLength it bounds the longest row, which verl's token "
            "budgets (ppo_max_token_len_per_gpu, log_prob_max_token_len_per_gpu) must hold."
        ),
    )
    max_response_length: int = Field(
        strict=True,
        default=DEFAULT_MAX_RESPONSE_LENGTH,
        ge=1,
        description=(
            "Tokens of a training row's response (model output, and tool output between calls at mask 0) at "
            "most: a longer one is cut here (counted in training/adapter/truncated_rows). verl's "
            "data.max_response_length."
        ),
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Self:
        check_exactly_one(
            DATA_SOURCE_RULE,
            {"inline": self.inline, "configMapRef": self.config_map_ref, "path": self.path},
        )
        return self


class RolloutSpec(ApiModel):
    """How each prompt is rolled out."""

    samples_per_prompt: int = Field(
        strict=True,
        default=4,
        ge=1,
        description=(
            "Sibling rollouts per prompt group, one agent Job each (verl's rollout.n); an update uses whole "
            "groups only, as the group's reward statistics (GRPO) need."
        ),
    )
    drop_uniform_groups: bool = Field(
        strict=True,
        default=False,
        description=(
            "Dynamic sampling (DAPO): before an update, drop each complete group whose rollouts all scored "
            "the same reward (GRPO learns nothing from it) and draw a new prompt in its place; at most "
            "trainBatchSize groups per update, so a run whose every group scores alike still updates."
        ),
    )


class AsyncSpec(ApiModel):
    """Asynchronous collection: more prompt groups in flight than an update consumes; the rest carry over."""

    enabled: bool = Field(
        strict=True,
        default=False,
        description="Turn asynchronous collection on; off, every update waits for all groups of its batch.",
    )
    window_size: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_WINDOW_SIZE,
        description=(
            "Prompt groups kept active in async mode; required when enabled "
            "and greater than trainBatchSize (start with 2 x trainBatchSize)."
        ),
    )
    max_carry_over_age_steps: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        description=(
            "Oldest carry-over age, in updates, a group may reach; older groups get the staleness policy. "
            "Unset: groups are carried over however old."
        ),
    )
    refill_during_collection: bool = Field(
        strict=True,
        default=True,
        description=(
            "Draw a new prompt group each time one finishes, so windowSize groups keep generating "
            "while a step collects (finished ones wait for the update beside them); off, the window is "
            "refilled only when a step begins. On costs some staleness (groups are consumed older)."
        ),
    )
    staleness_policy: StalenessPolicy = Field(
        default=StalenessPolicy.CANCEL,
        description=(
            "What happens to groups older than maxCarryOverAgeSteps: `Cancel` deletes their Jobs and draws "
            "fresh prompts, `Keep` leaves them in the window and only reports them."
        ),
    )

    def window_config(self, *, train_batch_size: int, samples_per_prompt: int) -> WindowConfig:
        """The window these settings ask for with this batch; a `ValueError` when the window rule fails."""
        return WindowConfig(
            train_batch_size=train_batch_size,
            samples_per_prompt=samples_per_prompt,
            async_enabled=self.enabled,
            async_window_size=self.window_size,
            max_carry_over_age_steps=self.max_carry_over_age_steps,
            staleness_policy=self.staleness_policy,
            refill_during_collection=self.refill_during_collection,
        )


class RolloutCorrectionMode(StrEnum):
    """Granularity of the importance-sampling correction for off-policy (stale) rollouts."""

    TOKEN = "Token"
    SEQUENCE = "Sequence"
    DISABLED = "Disabled"


class RolloutCorrectionSpec(ApiModel):
    """Importance-sampling correction of rollouts generated by an older policy (verl's rollout_correction)."""

    mode: RolloutCorrectionMode = Field(
        default=RolloutCorrectionMode.TOKEN,
        description="`Token` or `Sequence` level importance sampling, or `Disabled`. `Token` kept reward per "
        "step within 3 % of synchronous training at data ages 1-4 where `Sequence` and `Disabled` fell "
        "behind (docs/tuning-the-window.md).",
    )
    threshold: float = Field(
        strict=True,
        default=2.0,
        gt=1,
        description="Upper bound of the importance-sampling weights (rollout_is_threshold).",
    )

    @property
    def rollout_is(self) -> Literal["token", "sequence"] | None:
        """verl's `algorithm.rollout_correction.rollout_is` for this mode; None when disabled."""
        if self.mode is RolloutCorrectionMode.TOKEN:
            return "token"
        if self.mode is RolloutCorrectionMode.SEQUENCE:
            return "sequence"
        return None


class TrainerBackend(StrEnum):
    """The training engine inside the trainer pod."""

    VERL = "Verl"  # verl + vLLM on GPUs
    REFERENCE = "Reference"  # a small local causal LM on CPU: CI, local mode, the quickstart


class SampleLevel(StrEnum):
    """How a rollout's model calls become training samples."""

    TRANSITION = "Transition"  # one sample per model call
    TRAJECTORY = "Trajectory"  # one sample per rollout, its calls joined


class CheckpointSpec(ApiModel):
    """Where and how often the trainer saves checkpoints."""

    claim_name: str | None = Field(
        default=None,
        min_length=1,
        description="PersistentVolumeClaim for checkpoints; unset keeps them in the pod (lost with it).",
    )
    every_steps: int = Field(
        strict=True, default=10, ge=1, description="Save a checkpoint every this many updates."
    )


MAX_TRAINER_NODES = 512


class TrainerSpec(ApiModel):
    """The trainer pod (or, with nodes > 1, the Ray cluster): the training backend on the shared GPUs."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(MULTI_NODE_CHECKPOINT_RULE, MULTI_NODE_BACKEND_RULE)
    )

    backend: TrainerBackend = Field(
        default=TrainerBackend.VERL,
        description="`Verl` (GPU, verl + vLLM) or `Reference` (CPU, a small local model).",
    )
    image: str = Field(
        default="ghcr.io/asyncrl/trainer:0.1.0", min_length=1, description="Container image of the trainer."
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description=(
            "Resources of the trainer container (limits, requests), quantities as in a pod spec; the GPUs "
            "come from `gpus`."
        ),
    )
    gpus: int = Field(
        strict=True,
        default=1,
        ge=0,
        description="GPUs of the trainer pod, shared by inference and training; 0 for the reference backend.",
    )
    nodes: int = Field(
        strict=True,
        default=1,
        ge=1,
        le=MAX_TRAINER_NODES,
        description=(
            "Nodes the trainer spans. 1: one trainer pod (a Job). More: a KubeRay RayCluster (KubeRay "
            "must be installed) whose head pod holds the trainer (the Ray driver) and the gateway, with "
            "nodes - 1 worker pods; verl trains and serves across all of them (trainer.nnodes). Needs the "
            "Verl backend and a ReadWriteMany checkpoint.claimName."
        ),
    )
    gpus_per_node: int | None = Field(
        strict=True,
        default=None,
        ge=0,
        description=(
            "GPUs of each Ray node when nodes > 1 (the head pod's Ray container and every worker pod; "
            "verl's trainer.n_gpus_per_node); unset: trainer.gpus."
        ),
    )
    verl_overrides: dict[str, Any] | None = Field(
        default=None,
        description=(
            "verl settings merged into verl's trainer config: Hydra keys, flat with dots or nested; a "
            "leading + adds an undeclared key. Keys the run sets itself (batch sizes, "
            "rollout.samplesPerPrompt, the model, GPUs, rollout correction) are rejected. The Reference "
            "backend reads one of them, actor_rollout_ref.actor.optim.lr (its learning rate), and "
            "ignores the others. actor_rollout_ref.rollout.top_p and top_k must stay off (1 and -1): "
            "vLLM's log-probs are those after the filter, the trainer's are not, so the importance weights "
            "would be biased."
        ),
    )
    pod_template: TrainerPodTemplate | None = Field(
        default=None,
        description=(
            "Additions to the trainer pod: labels, scheduling (nodeSelector, tolerations, affinity, "
            "priorityClassName), serviceAccountName, volumes, and the trainer container's env, mounts and "
            "securityContext; fields the operator owns are kept and reported."
        ),
    )
    checkpoint: CheckpointSpec = section(CheckpointSpec, "Where and how often checkpoints are saved.")
    failed_rollout_reward: float = Field(
        strict=True,
        default=0.0,
        description="Reward given to rollouts that failed or timed out without a reward.",
    )
    sample_level: SampleLevel = Field(
        default=SampleLevel.TRAJECTORY,
        description="Train on each model call (`Transition`) or on each whole rollout (`Trajectory`).",
    )

    @model_validator(mode="after")
    def _multi_node_rules(self) -> Self:
        if self.nodes > 1 and self.backend is not TrainerBackend.VERL:
            raise FieldRuleError(MULTI_NODE_BACKEND_RULE.message, field_path=("nodes",))
        if self.nodes > 1 and self.checkpoint.claim_name is None:
            raise FieldRuleError(MULTI_NODE_CHECKPOINT_RULE.message, field_path=("checkpoint", "claimName"))
        return self

    @property
    def node_gpus(self) -> int:
        """GPUs of each node of the trainer: gpusPerNode when set, else gpus."""
        return self.gpus if self.gpus_per_node is None else self.gpus_per_node

    @field_validator("verl_overrides")
    @classmethod
    def _no_owned_verl_keys(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        errors = owned_key_errors(value or {}) + learning_rate_errors(flatten_overrides(value or {}))
        if errors:
            raise ValueError("; ".join(errors))
        rollout_sampling_of(flatten_overrides(value or {}))  # numbers, in range, no top-p/top-k filter
        return value

    def rollout_sampling(self) -> RolloutSampling:
        """The run's rollout temperature/top_p/top_k: verl's defaults unless verlOverrides sets them; always
        the defaults on the reference backend, whose update recomputes log-probs at temperature 1."""
        if self.backend is TrainerBackend.REFERENCE:
            return RolloutSampling()
        return rollout_sampling_of(flatten_overrides(self.verl_overrides or {}))


class GatewaySpec(ApiModel):
    """The gateway sidecar: the agents' model endpoint (with pause and drain) and the rollout store."""

    image: str = Field(
        default="ghcr.io/asyncrl/gateway:0.1.0", min_length=1, description="Container image of the gateway."
    )
    port: int = Field(
        strict=True, default=8090, ge=1, le=65535, description="Port of the gateway and its Service."
    )
    key_secret_ref: GatewayKeySecretRef | None = Field(
        default=None,
        description="Secret key holding the gateway key; unset, the operator generates a Secret for the run.",
    )
    pause_mode: PauseMode = Field(
        default=PauseMode.HOLD,
        description=(
            "What a model call arriving during a weight update gets. `Hold`: it waits in the gateway and "
            "is forwarded at the resume, so any agent (the OpenAI SDK at its defaults too) sees one slower "
            "answer. `Reject`: HTTP 429 + Retry-After + X-Agl-Paused at once (Agent Lightning's contract); "
            "the agent must retry until the update ends."
        ),
    )
    drain_policy: DrainPolicy = Field(
        default=DrainPolicy.ABORT,
        description=(
            "What happens to model calls in flight when an update begins. `Abort`: cancelled upstream at "
            "once so the update does not wait; with `Hold` they are re-issued after the update (only the "
            "re-issue is trained on), with `Reject` they get 429. `Wait`: the update waits until they finish."
        ),
    )
    hold_timeout_seconds: int = Field(
        strict=True,
        default=900,
        ge=1,
        description="Hold mode: a call held this long gets the 429 it would have had in Reject mode.",
    )
    max_held_calls: int = Field(
        strict=True,
        default=10_000,
        ge=1,
        description="Hold mode: model calls held at once; one more gets 429 at once.",
    )
    retry_after_seconds: float = Field(
        strict=True,
        default=5,
        ge=0.001,
        le=3600,
        description=(
            "Retry-After (fractions allowed; also sent as retry-after-ms) with HTTP 429 to model calls "
            "refused during a weight update: every such call in Reject mode, a held call past its bounds in "
            "Hold mode."
        ),
    )
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(requests=dict(DEFAULT_GATEWAY_REQUESTS)),
        description=(
            "Resources of the gateway container (limits, requests), quantities as in a pod spec; set, it "
            "replaces the default (requests cpu: 500m, memory: 512Mi). The gateway holds the window's "
            "captured model calls: size its memory from the window (docs/tuning-the-window.md, 'Sizing the "
            "gateway'), with the limit above maxCaptureBytes."
        ),
        json_schema_extra={"default": {"requests": DEFAULT_GATEWAY_REQUESTS}},
    )
    sampling_params: SamplingParamsPolicy = Field(
        default=SamplingParamsPolicy.ENFORCE,
        description=(
            "The request parameters of train-mode calls that change the distribution vLLM samples from: "
            "temperature/top_p/top_k, penalties, min_p, logit_bias, bad_words, allowed_token_ids, "
            "min_tokens, structured output, a forcing tool_choice (docs/writing-an-agent.md#sampling-"
            "parameters). `Enforce` sends the run's rollout settings (the temperature of "
            "actor_rollout_ref.rollout.temperature in verlOverrides, default 1.0; top_p 1.0, top_k -1) and "
            "removes the rest, recording what the agent asked for; `Reject` answers 400 to calls that ask "
            "for other values; `Allow` forwards them (the importance weights are then biased)."
        ),
    )
    capture: CaptureMode = Field(
        default=CaptureMode.COMPACT,
        description=(
            "What the gateway keeps of each model call. `Compact`: token ids and log-probs as packed arrays "
            "(about 4 bytes per prompt token, 12 per generated token), the request and response JSON "
            "dropped once read; training reads nothing else. `Full`: both JSON bodies kept too and shown in "
            "the events document, for debugging an agent or a model server (several times the memory)."
        ),
    )
    max_capture_bytes: int = Field(
        strict=True,
        default=DEFAULT_MAX_CAPTURE_BYTES,
        ge=4096,
        description=(
            "Bytes of captured model calls the gateway's store may hold in all; a model call past it gets "
            "HTTP 507 (with Retry-After) until the trainer consumes rollouts. Size the gateway's memory "
            "(resources) above it: see docs/tuning-the-window.md, 'Sizing the gateway'."
        ),
    )
    max_capture_bytes_per_rollout: int = Field(
        strict=True,
        default=DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT,
        ge=4096,
        description=(
            "Bytes of captured model calls one rollout may hold; its model calls past it get HTTP 413 "
            "(a multi-turn agent resends its history each turn, so this grows with turns squared)."
        ),
    )
    agent_url: str | None = Field(
        default=None,
        alias="agentURL",
        pattern=r"^https?://\S+$",
        description="Gateway URL given to agents instead of the Service's, for agents that cannot reach it.",
    )


class AgentTemplateSpec(ApiModel):
    """The Jinja template of the batch/v1 Job run per rollout; its variables come from the row's input."""

    model_config = ConfigDict(json_schema_extra=cel_rules(TEMPLATE_SOURCE_RULE))

    config_map_ref: ConfigMapKeyRef | None = Field(
        default=None, description="A ConfigMap key holding the template."
    )
    inline: str | None = Field(
        default=None, min_length=1, description="The template, written in the manifest."
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Self:
        check_exactly_one(TEMPLATE_SOURCE_RULE, {"configMapRef": self.config_map_ref, "inline": self.inline})
        return self


class AgentsMode(StrEnum):
    """How agents are started: a Job per rollout, or long-lived pods that take rollouts one after another."""

    JOBS = "Jobs"  # one Job (one pod) per rollout: full isolation, a pod start per rollout
    POOL = "Pool"  # a Deployment of agent pods, each running one rollout at a time: no pod start per rollout


class AgentPoolSpec(ApiModel):
    """The agent pool of `mode: Pool`: a Deployment the operator owns, built from the same template."""

    replicas: int = Field(
        strict=True, default=4, ge=0, le=1000, description="Agent pods; each runs one rollout at a time."
    )


class AgentsSpec(ApiModel):
    """The agents: one Kubernetes Job per rollout (or a pool of long-lived pods), rendered from a template."""

    mode: AgentsMode = Field(
        default=AgentsMode.JOBS,
        description="`Jobs`: one Job per rollout. `Pool`: `pool.replicas` long-lived pods that each run the "
        "template's first container for one rollout after another (for short rollouts, where pod start-up "
        "dominates); same template, same AGL_* environment, at most once per rollout.",
    )
    pool: AgentPoolSpec = section(AgentPoolSpec, "The agent pool (used when mode is Pool).")

    template: AgentTemplateSpec = Field(
        description="The Job template; exactly one of configMapRef or inline."
    )
    max_jobs_per_minute: int = Field(
        strict=True, default=100, ge=1, description="Rate limit of agent Job creation."
    )
    max_active_jobs: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        description="Most agent Jobs running at once; unset, as many as rollouts are queued.",
    )
    ttl_seconds_after_finished: int = Field(
        strict=True, default=1200, ge=0, description="Seconds after which finished agent Jobs are deleted."
    )


class WandbMode(StrEnum):
    """Where Weights & Biases writes the run."""

    OFFLINE = "Offline"
    ONLINE = "Online"
    DISABLED = "Disabled"

    @property
    def wandb_mode(self) -> Literal["offline", "online", "disabled"]:
        """The value W&B itself takes (`WANDB_MODE`, `wandb.init(mode=...)`)."""
        modes: dict[WandbMode, Literal["offline", "online", "disabled"]] = {
            WandbMode.OFFLINE: "offline",
            WandbMode.ONLINE: "online",
            WandbMode.DISABLED: "disabled",
        }
        return modes[self]


class WandbSpec(ApiModel):
    """Weights & Biases logging of the per-step metrics."""

    project: str | None = Field(
        default=None, min_length=1, description="W&B project; unset uses the run name."
    )
    mode: WandbMode = Field(
        default=WandbMode.OFFLINE, description="`Offline` (files in the pod), `Online` or `Disabled`."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the W&B API key (needed for `Online`)."
    )


class LoggingSpec(ApiModel):
    """Where the per-step metrics go besides Prometheus and the run's status."""

    wandb: WandbSpec = section(WandbSpec, "Weights & Biases logging.")


class AsyncTrainingRunSpec(ApiModel):
    """What to train, on which data, with which agents, and how asynchronously."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ASYNC_WINDOW_RULE,
            MULTI_NODE_GATEWAY_PORT_RULE,
            VERL_MINI_BATCH_RULE,
            VERL_TOKEN_BUDGET_RULE,
            *immutable_rules(),
        )
    )

    model: ModelSpec = Field(description="The policy model to serve and train.")
    data: DataSpec = Field(description="The prompts; exactly one of inline, configMapRef or path.")
    train_batch_size: int = Field(
        strict=True, ge=1, le=MAX_TRAIN_BATCH_SIZE, description="Complete prompt groups consumed per update."
    )
    rollout: RolloutSpec = section(RolloutSpec, "How each prompt is rolled out.")
    rollout_timeout_seconds: int = Field(
        strict=True,
        default=1800,
        ge=1,
        description="Seconds after which a rollout that has not finished is failed.",
    )
    total_steps: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        description="Stop after this many updates; unset, after one pass over the data.",
    )
    max_failed_steps: int = Field(
        strict=True,
        default=3,
        ge=1,
        description=(
            "Consecutive updates whose groups hold no succeeded rollout after which the run fails "
            "(an agent that always crashes, a template that never renders)."
        ),
    )
    async_: AsyncSpec = Field(
        default_factory=AsyncSpec,
        alias="async",
        description="Asynchronous collection with carry-over; off by default.",
        json_schema_extra={"default": {}},
    )
    rollout_correction: RolloutCorrectionSpec = section(
        RolloutCorrectionSpec, "Importance-sampling correction of stale rollouts."
    )
    trainer: TrainerSpec = section(TrainerSpec, "The trainer pod.")
    gateway: GatewaySpec = section(GatewaySpec, "The gateway sidecar of the trainer pod.")
    agents: AgentsSpec = Field(description="The agents: one Job per rollout, rendered from a template.")
    logging: LoggingSpec = section(LoggingSpec, "Where per-step metrics are logged.")
    suspend: bool = Field(
        strict=True,
        default=False,
        description="Pause the run while true: no new rollouts or agent Jobs; the phase becomes Suspended.",
    )

    @model_validator(mode="after")
    def _async_window_exceeds_train_batch(self) -> Self:
        self.window_config()
        return self

    @model_validator(mode="after")
    def _gateway_port_free_of_ray(self) -> Self:
        if self.trainer.nodes > 1 and gateway_port_taken_by_ray(self.gateway.port):
            raise FieldRuleError(MULTI_NODE_GATEWAY_PORT_RULE.message, field_path=("gateway", "port"))
        return self

    @model_validator(mode="after")
    def _verl_batch_layout(self) -> Self:
        """verl's first update would assert on these (see verl_layout); only the verl backend has them."""
        if self.trainer.backend is not TrainerBackend.VERL:
            return self
        problems = layout_errors(self.verl_layout())
        if problems:
            raise FieldRuleError("; ".join(p.message for p in problems), field_path=problems[0].field_path)
        return self

    def verl_layout(self) -> VerlLayout:
        """The numbers that decide how verl batches this run's rows over its GPUs."""
        return VerlLayout(
            train_batch_size=self.train_batch_size,
            samples_per_prompt=self.rollout.samples_per_prompt,
            gpus_per_node=self.trainer.node_gpus,
            nodes=self.trainer.nodes,
            max_prompt_length=self.data.max_prompt_length,
            max_response_length=self.data.max_response_length,
            overrides=flatten_overrides(self.trainer.verl_overrides or {}),
        )

    def window_config(self) -> WindowConfig:
        """The async window's configuration (asyncrl.trainer.window); raises when the window rule fails."""
        try:
            return self.async_.window_config(
                train_batch_size=self.train_batch_size, samples_per_prompt=self.rollout.samples_per_prompt
            )
        except ValidationError as error:
            messages = "; ".join(
                str(detail.get("ctx", {}).get("error", detail["msg"])) for detail in error.errors()
            )
            raise FieldRuleError(messages, field_path=("async", "windowSize")) from None
