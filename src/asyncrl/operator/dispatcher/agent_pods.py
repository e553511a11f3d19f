"""Agent pods that cannot start, from their container statuses (pure; the dispatcher lists the pods).

An agent Job whose pod cannot pull its image, cannot be configured (a missing Secret or ConfigMap key) or
keeps crashing stays active without a failure until its deadline (`rolloutTimeoutSeconds`, 30 minutes by
default): the run showed Running, "training", Ready=True, at 0 steps, for as long as anyone watched. The
dispatcher looks at its agent pods every `CHECK_SECONDS` and says what it finds on the run (a condition, a
Warning event naming the pod and the image, the status message); a pod that cannot start fails its rollout
after the start timeout, and the run fails when no agent pod of it has ever started by then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

CHECK_SECONDS = 15.0
DEFAULT_START_TIMEOUT_SECONDS = 300.0  # `asyncrl operator --agent-start-timeout-seconds`
WARN_AGAIN_SECONDS = 600.0  # the same reason and image are warned about again after this

# The kubelet's waiting reasons of a container that will not start by waiting: it needs a fix of the
# template, the image or the namespace (the kubelet retries pulls, but a name that does not resolve stays so).
NEVER_STARTS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# Started, but keeps failing: said on the run; the Job's own backoff ends it.
CRASHING = frozenset({"CrashLoopBackOff", "RunContainerError"})


@dataclass(frozen=True)
class StuckPod:
    pod: str
    job: str | None  # the Job that owns it
    container: str
    image: str
    reason: str  # the kubelet's waiting reason
    message: str
    created: datetime | None

    @property
    def never_starts(self) -> bool:
        return self.reason in NEVER_STARTS

    def describe(self) -> str:
        said = f": {self.message}" if self.message else ""
        return f"pod {self.pod}, container {self.container}, image {self.image}: {self.reason}{said}"

    def stuck_seconds(self, now: datetime) -> float:
        return 0.0 if self.created is None else (now - self.created).total_seconds()


def stuck_pods(pods: Iterable[Mapping[str, Any]]) -> list[StuckPod]:
    """The pods (not yet ended) with a container waiting for one of the reasons above, one entry per pod."""
    found = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        metadata = pod.get("metadata") or {}
        images = {
            container.get("name"): container.get("image", "")
            for container in [
                *((pod.get("spec") or {}).get("initContainers") or []),
                *((pod.get("spec") or {}).get("containers") or []),
            ]
        }
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason") or ""
            if reason in NEVER_STARTS or reason in CRASHING:
                found.append(
                    StuckPod(
                        pod=str(metadata.get("name")),
                        job=_owning_job(metadata),
                        container=str(container.get("name")),
                        image=str(images.get(container.get("name")) or container.get("image") or "?"),
                        reason=reason,
                        message=" ".join(str(waiting.get("message") or "").split())[:300],
                        created=_timestamp(metadata.get("creationTimestamp")),
                    )
                )
                break
    return found


def summary(stuck: list[StuckPod]) -> tuple[str, str] | None:
    """For the run's status: the commonest waiting reason, and one line saying how many agent pods cannot
    start, with an example."""
    if not stuck:
        return None
    reason, count = Counter(pod.reason for pod in stuck).most_common(1)[0]
    example = next(pod for pod in stuck if pod.reason == reason)
    others = len(stuck) - count
    more = f" (and {others} more for other reasons)" if others else ""
    verb = "keep crashing" if reason in CRASHING else "cannot start"
    return reason, f"{count} agent pod{'s' if count > 1 else ''} {verb}{more}: {example.describe()}"


def _owning_job(metadata: Mapping[str, Any]) -> str | None:
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == "Job":
            return str(owner.get("name"))
    labels = metadata.get("labels") or {}
    job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
    return str(job) if job else None


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
