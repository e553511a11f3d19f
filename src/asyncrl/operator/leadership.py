"""Leader election through a coordination.k8s.io/v1 Lease: the decision, as a pure function of what was read.

kopf has no leader election (its "peering" only pauses an operator that sees a peer of higher priority), and
two operators acting on the same runs both write every run's status, each from its own view. So replicas
elect one leader the way client-go's `leaderelection` does:
- one Lease names the holder, which renews it every `retry_seconds`;
- a candidate takes the Lease over when it is free (absent, released, or already naming this identity: a
  restarted container of the same pod), or when the record it read has not changed for the record's
  `leaseDurationSeconds` on the candidate's own clock (the holder's timestamps are never compared with
  local time: clocks differ between nodes);
- every write carries the resourceVersion that was read, so of two candidates only one wins (409 for the
  other);
- the holder gives up, and the process exits, once it could not renew for `renew_deadline_seconds`, which is
  shorter than the lease: it stops before any candidate may take over. Seeing another holder, or the Lease
  gone, ends it at once.

The I/O (reading, writing, the loop and exiting) is in `elector.py`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Shorter than client-go's 15 s / 10 s / 2 s, for the failover target (under 15 s from a SIGKILLed leader to
# the new leader acting). A standby sees each renewal up to `retry` late and the leader dies up to `retry`
# after its last renewal, so it takes over `lease` to `lease + retry` after the kill, then starts the runs:
# with client-go's durations 13 to 17 s plus the start (14.4 s measured once); with these 8 to 12 s plus it.
# The holder's margin between its deadline and the expiry others see stays 3 s (one more renewal try).
LEASE_SECONDS = 10.0
RENEW_DEADLINE_SECONDS = 7.0
RETRY_SECONDS = 2.0
DEFAULT_LEASE_NAME = "asyncrl-operator"


class LeaderElectionConfig(BaseModel):
    """Filled from `asyncrl operator --leader-elect` and its flags (operator/main.py)."""

    model_config = ConfigDict(frozen=True)

    lease_name: str = DEFAULT_LEASE_NAME
    namespace: str
    identity: str = Field(min_length=1)  # the pod's name in a cluster: stable across container restarts
    lease_seconds: float = LEASE_SECONDS  # how long a record must stay unchanged before others take it
    renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS  # the holder exits when it renewed no later
    retry_seconds: float = RETRY_SECONDS  # the holder renews, and a candidate looks, this often

    @model_validator(mode="after")
    def _deadline_inside_the_lease(self) -> LeaderElectionConfig:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError("need 0 < retry_seconds < renew_deadline_seconds < lease_seconds")
        return self

    @property
    def lease(self) -> str:
        """`namespace/name`, as log lines name it."""
        return f"{self.namespace}/{self.lease_name}"


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease the election reads."""

    holder: str  # "": released
    lease_seconds: float
    transitions: int
    acquire_time: str | None  # kept as written (RFC 3339 with microseconds)
    resource_version: str

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_seconds=float(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            acquire_time=spec.get("acquireTime"),
            resource_version=str(lease["metadata"]["resourceVersion"]),
        )


@dataclass(frozen=True)
class Sighting:
    """A record, and since when (this process's monotonic clock) it has stood unchanged."""

    record: LeaseRecord
    since: float


def sighted(previous: Sighting | None, record: LeaseRecord, now: float) -> Sighting:
    """What is known after reading `record` at `now`: its clock restarts whenever the Lease was written."""
    if previous is not None and previous.record.resource_version == record.resource_version:
        return previous
    return Sighting(record=record, since=now)


class NoLease(enum.Enum):
    ABSENT = "absent"  # the API server answered 404
    UNREADABLE = "unreadable"  # the read failed (API server unreachable, refused, timed out)


class Verdict(enum.StrEnum):
    ACQUIRE = "acquire"  # create the Lease, or write this identity into it
    RENEW = "renew"  # the holder writes a new renewTime
    WAIT = "wait"  # write nothing; look again later (a holder keeps leading until its renew deadline)
    LOST = "lost"  # the holder must stop now: exit before any other write


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


def decide(
    *,
    lease: Sighting | NoLease,
    identity: str,
    renewed_at: float | None,
    now: float,
    config: LeaderElectionConfig,
) -> Decision:
    """What to do after a read. `renewed_at`: when (monotonic) this holder's last successful write was sent;
    None while not leading. The rules, in order:
    - a holder past its renew deadline has lost, whatever it read (others may take over soon after);
    - a holder that reads another holder or no Lease has lost;
    - a candidate takes a Lease that is absent, released, its own, or unchanged for its whole duration."""
    if renewed_at is not None:
        if now - renewed_at >= config.renew_deadline_seconds:
            return Decision(
                Verdict.LOST,
                f"could not renew the Lease for {now - renewed_at:.1f} s "
                f"(renew deadline {config.renew_deadline_seconds:g} s)",
            )
        match lease:
            case NoLease.UNREADABLE:
                return Decision(Verdict.WAIT, "the Lease could not be read; renewing again soon")
            case NoLease.ABSENT:
                return Decision(Verdict.LOST, "the Lease was deleted")
            case Sighting(record=record) if record.holder != identity:
                return Decision(Verdict.LOST, f"{record.holder or 'nobody'} holds the Lease now")
        return Decision(Verdict.RENEW, "holding the Lease")
    match lease:
        case NoLease.UNREADABLE:
            return Decision(Verdict.WAIT, "the Lease could not be read")
        case NoLease.ABSENT:
            return Decision(Verdict.ACQUIRE, "no Lease exists")
        case Sighting(record=record) if not record.holder:
            return Decision(Verdict.ACQUIRE, "the Lease was released")
        case Sighting(record=record) if record.holder == identity:
            return Decision(Verdict.ACQUIRE, "the Lease names this identity (a restarted container)")
        case Sighting(record=record, since=since) if now - since >= record.lease_seconds:
            return Decision(
                Verdict.ACQUIRE, f"{record.holder} did not renew the Lease for {now - since:.1f} s"
            )
        case Sighting(record=record):
            return Decision(Verdict.WAIT, f"{record.holder} holds the Lease")
    raise AssertionError(lease)  # unreachable: every case above returns


def wait_seconds(
    *, lease: Sighting | NoLease, leading: bool, now: float, config: LeaderElectionConfig
) -> float:
    """How long until the next look: `retry_seconds`, or less for a candidate whose held Lease expires sooner
    (so it takes over at the expiry, not up to `retry_seconds` after it)."""
    if leading or not isinstance(lease, Sighting) or not lease.record.holder:
        return config.retry_seconds
    expires_in = lease.since + lease.record.lease_seconds - now
    return max(0.0, min(config.retry_seconds, expires_in))


def lease_spec(
    *, previous: LeaseRecord | None, identity: str, now: datetime, config: LeaderElectionConfig
) -> dict[str, Any]:
    """The Lease's spec that acquires (another holder before, or none) or renews (this identity before)."""
    stamp = micro_time(now)
    renewing = previous is not None and previous.holder == identity
    transitions = 0 if previous is None else previous.transitions + (0 if renewing else 1)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": round(config.lease_seconds),
        "acquireTime": previous.acquire_time if renewing and previous is not None else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }


def released_spec(*, previous: LeaseRecord, now: datetime) -> dict[str, Any]:
    """A graceful stop's release: no holder, so a candidate takes the Lease at its next look (client-go's)."""
    stamp = micro_time(now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": previous.transitions,
    }


def micro_time(moment: datetime) -> str:
    """A Lease's MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
