"""Each agent's share of the gateway, as pure rules: requests in flight and body bytes per second per
rollout token, on a fake clock; and the depth measure on bytes that lets a wide body skip the walk."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.gateway import admission
from asyncrl.gateway.admission import Refused, find_json_problem, nested_deeper_than, parse_json
from asyncrl.gateway.budgets import VALUE_COST_BYTES, AgentBudget, AgentBudgets, OverBudget, json_values


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_agent_over_its_requests_in_flight_is_refused_while_another_agent_is_not() -> None:
    budgets = AgentBudgets(AgentBudget(max_requests=2))
    budgets.enter("r1")
    budgets.enter("r1")
    with pytest.raises(OverBudget) as over:
        budgets.enter("r1")
    assert over.value.budget == "requests"
    assert over.value.retry_after_seconds > 0
    budgets.enter("r2")  # another rollout's agent has its own share
    budgets.leave("r1")
    budgets.enter("r1")  # one ended: room again


def test_body_bytes_are_paid_from_a_bucket_that_refills_at_the_rate() -> None:
    clock = FakeClock()
    budget = AgentBudget(bytes_per_second=1000 * 1024, burst_bytes=4000 * 1024)
    budgets = AgentBudgets(budget, clock=clock)
    budgets.charge("r1", 4000 * 1024)  # the whole burst at once
    with pytest.raises(OverBudget) as over:
        budgets.charge("r1", 500 * 1024)
    assert over.value.budget == "bytes"
    assert over.value.retry_after_seconds == pytest.approx(0.5)  # what it lacks, at the rate
    budgets.charge("r2", 4000 * 1024)  # not r1's bucket
    clock.now += 0.5
    budgets.charge("r1", 500 * 1024)  # refilled by then
    with pytest.raises(OverBudget):
        budgets.charge("r1", 1)


def test_a_share_with_nothing_in_flight_and_a_full_bucket_is_forgotten() -> None:
    clock = FakeClock()
    budgets = AgentBudgets(AgentBudget(bytes_per_second=1024, burst_bytes=2048), clock=clock)
    budgets.enter("r1")
    budgets.charge("r1", 2048)
    budgets.leave("r1")
    assert budgets.tracked() == 1  # its bucket is still refilling: remembered
    clock.now += 2
    budgets.enter("r1")
    budgets.leave("r1")
    assert budgets.tracked() == 0


def test_the_burst_must_hold_the_largest_body() -> None:
    from pydantic import SecretStr, ValidationError

    from asyncrl.gateway.config import GatewayConfig
    from asyncrl.gateway.run_settings import standalone_defaults

    with pytest.raises(ValidationError, match="--agent-burst-bytes"):
        GatewayConfig(
            run=standalone_defaults(model="m"),
            key=SecretStr("k"),
            max_body_bytes=8 * 1024 * 1024,
            agent_budget=AgentBudget(burst_bytes=1024 * 1024),
        )


json_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=40,
)


@given(value=json_trees, max_depth=st.integers(min_value=1, max_value=8))
def test_the_depth_measured_on_bytes_is_the_depth_of_the_parsed_value(value: Any, max_depth: int) -> None:
    """Strings full of brackets, quotes and backslashes do not fool it, in either direction."""
    raw = json.dumps(value).encode()
    too_deep = (find_json_problem(value, max_depth=max_depth) or ("",))[0] == "too_deep"
    assert nested_deeper_than(raw, max_depth) is too_deep


class CountingDecoder:
    """msgspec's decoder, counting its calls, so a test can tell a body that was never parsed."""

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self.calls = 0

    def decode(self, raw: bytes) -> Any:
        self.calls += 1
        return self.decoder.decode(raw)


def test_a_wide_body_nested_too_deep_is_refused_without_being_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A megabyte of containers with one branch too deep at its end: refused from its bytes (422), with no
    parser run on it (the previous door parsed it, then walked all its containers, to find the branch)."""
    counting = CountingDecoder(admission._DECODER)
    monkeypatch.setattr(admission, "_DECODER", counting)
    standard_parses: list[str] = []
    monkeypatch.setattr(admission._STRICT, "decode", lambda text: standard_parses.append(text) or {})
    parsed: list[int] = []
    raw = b'{"d":[' + b",".join([b"{}"] * 300_000) + b"," + b"[" * 70 + b"]" * 70 + b"]}"
    with pytest.raises(Refused) as refused:
        parse_json(raw, max_depth=64, count_parsed=parsed.append)
    assert refused.value.status == 422
    assert refused.value.body["setting"] == "--max-json-depth"
    assert (counting.calls, standard_parses, parsed) == (0, [], [])
    assert parse_json(b'{"d": [[1]]}', max_depth=64, count_parsed=parsed.append) == {"d": [[1]]}
    assert (counting.calls, parsed) == (1, [12])


def test_a_body_is_charged_for_its_json_values_and_one_that_could_never_be_paid_is_a_burst_refusal() -> None:
    assert json_values(b'{"a": [1, 2, {}]}') == 6  # an estimate from commas and brackets, about the values
    budgets = AgentBudgets(AgentBudget(burst_bytes=16 * 1024 * 1024))
    tiny_values = json_values(b"[" + b",".join([b"{}"] * 1_900_000) + b"]")
    with pytest.raises(OverBudget) as over:
        budgets.charge("r1", VALUE_COST_BYTES * tiny_values)
    assert over.value.budget == "burst"
    budgets.charge("r1", 16 * 1024 * 1024)  # nothing was taken by the refusal
