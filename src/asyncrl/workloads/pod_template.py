"""The user's `spec.trainer.podTemplate` merged into the trainer pod the operator builds (pure).

The operator owns what makes the pod a run's trainer: its containers and their commands, the gateway sidecar,
restartPolicy, its labels, the volumes and mounts of the run's config, key, checkpoints and data, and the
variables the trainer reads. The user owns everything else the template offers: scheduling, identity, their
own volumes and mounts, extra variables and the security context. On a collision the operator's value is kept
and the user's field is named in `refused`, so the run can say so instead of dropping it silently.
Everything else is passed through as written: the API server validates it when the Job is created.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from asyncrl.api.types.spec import TrainerPodTemplate

JSON = dict[str, Any]
TEMPLATE_PATH = "spec.trainer.podTemplate"
# Pod fields the template sets as a whole; the operator sets none of them itself.
POD_FIELDS = (
    ("node_selector", "nodeSelector"),
    ("tolerations", "tolerations"),
    ("affinity", "affinity"),
    ("priority_class_name", "priorityClassName"),
    ("service_account_name", "serviceAccountName"),
    ("security_context", "securityContext"),
)


@dataclass(frozen=True)
class MergedPodTemplate:
    """The trainer pod template to create, and the user's fields the operator refused (paths, one each)."""

    template: JSON
    refused: list[str] = field(default_factory=list)

    def refused_message(self) -> str | None:
        """One readable line naming every refused field, or None when all of the template was applied."""
        if not self.refused:
            return None
        return (
            f"{TEMPLATE_PATH}: the operator keeps its own value of {', '.join(self.refused)} "
            "(fields it sets for the run); rename or remove them"
        )


def merge_pod_template(
    operator_template: JSON, user: TrainerPodTemplate | None, *, trainer_container: str
) -> MergedPodTemplate:
    """`operator_template` (a Job's spec.template) with `user`'s additions; the input is not modified.

    `trainer_container` names the container of `operator_template` that gets the container additions.
    """
    template = copy.deepcopy(operator_template)
    if user is None:
        return MergedPodTemplate(template=template)
    refused: list[str] = []
    metadata = template.setdefault("metadata", {})
    if user.metadata is not None:
        for key, values in (("labels", user.metadata.labels), ("annotations", user.metadata.annotations)):
            refused += _merge_map(metadata, key, values or {}, f"metadata.{key}")
    pod: JSON = template["spec"]
    wire = user.model_dump(mode="json", by_alias=True, exclude_none=True)
    for attribute, key in POD_FIELDS:
        if getattr(user, attribute) is None:
            continue
        if key in pod:
            refused.append(key)
        else:
            pod[key] = wire[key]
    if user.volumes:
        refused += _append_named(pod, "volumes", wire["volumes"], "name", "volumes")
    container = next(c for c in pod["containers"] if c["name"] == trainer_container)
    additions = user.trainer_container
    if additions is not None:
        given = wire.get("trainerContainer", {})
        prefix = "trainerContainer"
        if additions.env:
            refused += _append_named(container, "env", given["env"], "name", f"{prefix}.env")
        if additions.env_from:
            # After the operator's env: an `env` entry wins over envFrom, so the operator's variables hold.
            container.setdefault("envFrom", []).extend(given["envFrom"])
        if additions.volume_mounts:
            refused += _append_named(
                container, "volumeMounts", given["volumeMounts"], "mountPath", f"{prefix}.volumeMounts"
            )
        if additions.security_context is not None:
            container["securityContext"] = {
                **(container.get("securityContext") or {}),
                **given["securityContext"],
            }
    return MergedPodTemplate(template=template, refused=refused)


def _merge_map(owner: JSON, key: str, given: dict[str, str], path: str) -> list[str]:
    """Add `given` to owner[key]; a key the operator already set (to another value) is refused."""
    current: dict[str, str] = owner.setdefault(key, {})
    refused = []
    for name, value in given.items():
        if name in current and current[name] != value:
            refused.append(f"{path}[{name}]")
        else:
            current[name] = value
    return refused


def _append_named(owner: JSON, key: str, given: list[JSON], identity: str, path: str) -> list[str]:
    """Append `given` entries to owner[key]; one whose `identity` the operator's entries use is refused.

    Duplicates among the user's own entries are passed through: the API server names them.
    """
    current: list[JSON] = owner.setdefault(key, [])
    owned = {entry[identity] for entry in current}
    refused = []
    for entry in given:
        if entry[identity] in owned:
            refused.append(f"{path}[{identity}={entry[identity]}]")
        else:
            current.append(entry)
    return refused
