"""The leader election's decision (operator/leadership.py), its flags (operator/main.py) and what readiness
and the permissions review add for it, without a cluster. The Lease on a real API server, two operator
processes and a SIGKILLed leader are in test_leader_election_controlplane.py."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.operator.elector import LEASE_PERMISSIONS, default_identity, required_permissions
from asyncrl.operator.health import Readiness
from asyncrl.operator.leadership import (
    LeaderElectionConfig,
    LeaseRecord,
    NoLease,
    Sighting,
    Verdict,
    decide,
    lease_spec,
    released_spec,
    sighted,
    wait_seconds,
)
from asyncrl.operator.main import add_arguments, election_namespace, leader_election
from asyncrl.operator.permissions import Missing, missing_permissions

RBAC = Path(__file__).resolve().parents[2] / "operator" / "rbac"
CONFIG = LeaderElectionConfig(namespace="ops", identity="me")


def _record(holder: str, version: str = "1", transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(
        holder=holder,
        lease_seconds=CONFIG.lease_seconds,
        transitions=transitions,
        acquire_time="t0",
        resource_version=version,
    )


def _candidate(lease: Sighting | NoLease, now: float) -> Verdict:
    return decide(lease=lease, identity="me", renewed_at=None, now=now, config=CONFIG).verdict


def _leader(lease: Sighting | NoLease, renewed_at: float, now: float) -> Verdict:
    return decide(lease=lease, identity="me", renewed_at=renewed_at, now=now, config=CONFIG).verdict


# -- a candidate --------------------------------------------------------------------------------------------


def test_a_candidate_takes_a_lease_that_is_absent_released_or_its_own() -> None:
    assert _candidate(NoLease.ABSENT, now=0) is Verdict.ACQUIRE
    assert _candidate(Sighting(_record(""), since=100), now=100) is Verdict.ACQUIRE
    # A restarted container of the same pod (POD_NAME) takes its Lease back without waiting for it to expire.
    assert _candidate(Sighting(_record("me"), since=100), now=100) is Verdict.ACQUIRE


def test_a_candidate_waits_while_the_holder_keeps_renewing_and_takes_over_once_it_stops() -> None:
    first = sighted(None, _record("other", "1"), now=0)
    assert _candidate(first, now=9.9) is Verdict.WAIT
    # The holder renewed (a new resourceVersion): the candidate's clock starts again from this sighting.
    renewed = sighted(first, _record("other", "2"), now=9.9)
    assert renewed.since == 9.9
    assert _candidate(renewed, now=19) is Verdict.WAIT
    # Read again unchanged: the sighting keeps its time, and after the record's duration it has expired.
    unchanged = sighted(renewed, _record("other", "2"), now=20)
    assert unchanged.since == 9.9
    decision = decide(lease=unchanged, identity="me", renewed_at=None, now=20, config=CONFIG)
    assert decision.verdict is Verdict.ACQUIRE
    assert "other did not renew" in decision.reason


def test_a_candidate_that_cannot_read_the_lease_waits() -> None:
    assert _candidate(NoLease.UNREADABLE, now=1000) is Verdict.WAIT


def test_a_candidate_looks_again_at_the_expiry_rather_than_a_whole_retry_after_it() -> None:
    held = Sighting(_record("other"), since=0)
    assert wait_seconds(lease=held, leading=False, now=5, config=CONFIG) == CONFIG.retry_seconds
    assert wait_seconds(lease=held, leading=False, now=9.5, config=CONFIG) == pytest.approx(0.5)
    assert wait_seconds(lease=held, leading=False, now=20, config=CONFIG) == 0
    assert wait_seconds(lease=held, leading=True, now=9.5, config=CONFIG) == CONFIG.retry_seconds


# -- the holder ---------------------------------------------------------------------------------------------


def test_the_holder_renews_its_lease() -> None:
    assert _leader(Sighting(_record("me"), since=0), renewed_at=0, now=2) is Verdict.RENEW


def test_the_holder_has_lost_when_another_holder_or_no_lease_is_read() -> None:
    decision = decide(
        lease=Sighting(_record("other"), since=2), identity="me", renewed_at=0, now=2, config=CONFIG
    )
    assert (decision.verdict, decision.reason) == (Verdict.LOST, "other holds the Lease now")
    assert _leader(NoLease.ABSENT, renewed_at=0, now=2) is Verdict.LOST


def test_the_holder_keeps_leading_through_failed_reads_until_its_renew_deadline() -> None:
    assert _leader(NoLease.UNREADABLE, renewed_at=0, now=6.9) is Verdict.WAIT
    decision = decide(lease=NoLease.UNREADABLE, identity="me", renewed_at=0, now=7, config=CONFIG)
    assert decision.verdict is Verdict.LOST
    assert "renew deadline 7 s" in decision.reason
    # Past its deadline it has lost even when the read shows it still holding: others may take over soon.
    assert _leader(Sighting(_record("me"), since=0), renewed_at=0, now=7.5) is Verdict.LOST


def test_renewing_keeps_the_acquire_time_and_transitions_and_acquiring_counts_a_transition() -> None:
    now = datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)
    renewed = lease_spec(previous=_record("me", transitions=3), identity="me", now=now, config=CONFIG)
    assert renewed == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 10,
        "acquireTime": "t0",
        "renewTime": "2026-12-07T12:00:00.123456Z",
        "leaseTransitions": 3,
    }
    taken = lease_spec(previous=_record("other", transitions=3), identity="me", now=now, config=CONFIG)
    assert (taken["acquireTime"], taken["leaseTransitions"]) == ("2026-12-07T12:00:00.123456Z", 4)
    assert lease_spec(previous=None, identity="me", now=now, config=CONFIG)["leaseTransitions"] == 0
    released = released_spec(previous=_record("me", transitions=3), now=now)
    assert (released["holderIdentity"], released["leaseTransitions"]) == ("", 3)


def test_durations_must_leave_the_deadline_inside_the_lease() -> None:
    assert (CONFIG.lease_seconds, CONFIG.renew_deadline_seconds, CONFIG.retry_seconds) == (10, 7, 2)
    with pytest.raises(ValueError, match="renew_deadline_seconds < lease_seconds"):
        LeaderElectionConfig(namespace="ops", identity="me", renew_deadline_seconds=10)


# -- several replicas, simulated: at most one leads at any time ---------------------------------------------


@dataclass
class _Store:
    """The API server's Lease: a write succeeds only at the resourceVersion read (optimistic concurrency)."""

    record: LeaseRecord | None = None
    version: int = 0

    def write(self, expected: LeaseRecord | None, holder: str) -> bool:
        if (self.record and self.record.resource_version) != (expected and expected.resource_version):
            return False  # 409 (or 409 on create: it exists)
        self.version += 1
        self.record = LeaseRecord(holder, CONFIG.lease_seconds, 0, None, str(self.version))
        return True


@dataclass
class _Replica:
    identity: str
    sighting: Sighting | None = None
    renewed_at: float | None = None
    alive: bool = True
    lost_at: list[float] = field(default_factory=list)

    def look(self, store: _Store, now: float, *, read_fails: bool) -> None:
        lease: Sighting | NoLease
        if read_fails:
            lease = NoLease.UNREADABLE
        elif store.record is None:
            lease = NoLease.ABSENT
        else:
            lease = self.sighting = sighted(self.sighting, store.record, now)
        verdict = decide(
            lease=lease, identity=self.identity, renewed_at=self.renewed_at, now=now, config=CONFIG
        ).verdict
        if verdict is Verdict.LOST:
            self.renewed_at = None
            self.alive = False  # the process exits
            self.lost_at.append(now)
        elif verdict in (Verdict.ACQUIRE, Verdict.RENEW):
            previous = lease.record if isinstance(lease, Sighting) else None
            if store.write(previous, self.identity):
                self.renewed_at = now

    def believes_it_leads(self, now: float) -> bool:
        """It acts: it holds the Lease as far as it knows and its renew deadline has not passed."""
        return (
            self.alive
            and self.renewed_at is not None
            and now - self.renewed_at < CONFIG.renew_deadline_seconds
        )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2),  # which replica looks
            st.floats(min_value=0, max_value=8, allow_nan=False),  # after how long
            st.booleans(),  # its read fails
            st.integers(min_value=0, max_value=20),  # 0: that replica is SIGKILLed first
        ),
        max_size=60,
    )
)
def test_no_two_replicas_ever_lead_at_once(looks: list[tuple[int, float, bool, int]]) -> None:
    store, replicas, now = _Store(), [_Replica(f"r{i}") for i in range(3)], 0.0
    for index, elapsed, read_fails, kill in looks:
        now += elapsed
        replica = replicas[index]
        if kill == 0:
            replica.alive = False
        if replica.alive:
            replica.look(store, now, read_fails=read_fails)
        leaders = [r.identity for r in replicas if r.believes_it_leads(now)]
        assert len(leaders) <= 1, (now, leaders)


def test_a_standby_takes_over_from_a_killed_leader_within_the_lease_and_a_retry() -> None:
    store, leader, standby = _Store(), _Replica("a"), _Replica("b")
    leader.look(store, 0, read_fails=False)
    now = 0.0
    for _ in range(10):  # both at work: the leader renews, the standby looks, every 2 s
        now += 2
        leader.look(store, now, read_fails=False)
        standby.look(store, now + 0.5, read_fails=False)
        assert standby.renewed_at is None
    killed_at = now + 0.1
    while standby.renewed_at is None:
        lease = standby.sighting
        assert lease is not None
        now += wait_seconds(lease=lease, leading=False, now=now, config=CONFIG) or 0.01
        standby.look(store, now, read_fails=False)
    assert now - killed_at <= CONFIG.lease_seconds + 1
    assert store.record is not None
    assert store.record.holder == "b"


# -- flags, identity, readiness, permissions ----------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_leader_election_is_off_by_default_and_its_namespace_follows_the_pod_or_the_one_namespace() -> None:
    assert leader_election(_args("-n", "team"), {}) is None
    config = leader_election(_args("-n", "team", "--leader-elect"), {"POD_NAME": "op-7f9c-x2"})
    assert config is not None
    assert (config.lease_name, config.namespace, config.identity) == (
        "asyncrl-operator",
        "team",
        "op-7f9c-x2",
    )
    assert election_namespace(None, {"POD_NAMESPACE": "ops"}, ["team"]) == "ops"
    assert election_namespace("mine", {"POD_NAMESPACE": "ops"}, ["team"]) == "mine"


@pytest.mark.parametrize("scope", [["-A"], ["-n", "a", "-n", "b"]], ids=["all-namespaces", "two-namespaces"])
def test_an_undecidable_lease_namespace_is_an_error_naming_the_flag(scope: list[str]) -> None:
    with pytest.raises(ValueError, match="--leader-election-namespace"):
        leader_election(_args(*scope, "--leader-elect"), {})


def test_without_a_pod_name_each_process_gets_an_identity_of_its_own() -> None:
    assert default_identity({"POD_NAME": "op-1"}) == "op-1"
    assert default_identity({}) != default_identity({})


def test_readiness_says_whether_this_replica_leads_and_a_standby_is_ready_too() -> None:
    readiness = Readiness(missing=[])
    assert readiness.answer() == (200, {"ready": True})
    readiness.leading = False
    assert readiness.answer() == (200, {"ready": True, "leading": False})
    readiness.leading = True
    assert readiness.answer() == (200, {"ready": True, "leading": True})


def test_the_review_checks_the_lease_permissions_only_with_election_and_the_rbac_grants_them() -> None:
    assert required_permissions(None) == []
    wanted = required_permissions(CONFIG)
    assert {(entry.namespace, entry.permission.verb) for entry in wanted} == {
        ("ops", "get"),
        ("ops", "create"),
        ("ops", "update"),
    }
    missing = missing_permissions(["team"], lambda ns, p: p.resource != "leases", wanted)
    assert missing == sorted(wanted)
    assert all(entry.namespace == "ops" for entry in missing)
    (role,) = [
        d for d in yaml.safe_load_all((RBAC / "leader-election.yaml").read_text()) if d["kind"] == "Role"
    ]
    (rule,) = role["rules"]
    assert sorted(rule["verbs"]) == sorted(p.verb for p in LEASE_PERMISSIONS)
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert Missing("ops", LEASE_PERMISSIONS[0]) in wanted


def test_durations_from_flags_must_nest_and_the_error_names_the_flags() -> None:
    config = leader_election(
        _args("-n", "team", "--leader-elect", "--leader-election-lease-seconds=15"), {"POD_NAME": "op"}
    )
    assert config is not None
    assert (config.lease_seconds, config.renew_deadline_seconds, config.retry_seconds) == (15, 7, 2)
    with pytest.raises(ValueError, match=r"--leader-election-\*-seconds: .*renew_deadline_seconds < lease"):
        leader_election(_args("-n", "team", "--leader-elect", "--leader-election-lease-seconds=5"), {})
