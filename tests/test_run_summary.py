"""The summary's text from objects already read (pure), the trainer's metrics as its registry serves them.

The control plane cannot reach a trainer's metrics (tests/test_cluster_cli.py says why), so the reachable
case is here: the text of a real trainer registry (`PrometheusSink`) after a step.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import generate_latest

from asyncrl.cluster_cli import _stream_reason
from asyncrl.run_summary import EventLine, TrainerMetrics, parse_gauges, summary_lines
from asyncrl.trainer.metrics import PrometheusSink

NOW = datetime(2026, 1, 2, 12, 0, 0, tzinfo=UTC)
RUN = {
    "metadata": {"namespace": "team", "name": "demo"},
    "spec": {"totalSteps": 10},
    "status": {"phase": "Running", "step": 4, "lastStepTime": "2026-01-02T11:58:00Z", "activeGroups": 3},
}


def test_the_trainers_latest_step_is_shown_from_its_registrys_text() -> None:
    sink = PrometheusSink()
    sink.log(4, {"critic/score/mean": 0.625, "timing_s/step": 12.5, "training/adapter/rows": 8.0})
    sink.holding_pause.set(0)
    gauges = parse_gauges(generate_latest(sink.registry).decode())
    assert gauges["asyncrl_critic_score_mean"] == 0.625
    trainer = TrainerMetrics(gauges=gauges, source="service demo-gateway")
    lines = summary_lines(RUN, events=[], trainer=trainer, now=NOW)
    assert (
        "steps:          5/10 done; the last was step 4 (status.step, counted from 0 as in the trainer's log)"
        in lines
    )
    assert "last step at:   2026-01-02T11:58:00Z (2m ago)" in lines
    assert "  activeGroups: 3" in lines
    assert "trainer metrics (service demo-gateway):" in lines
    assert "  asyncrl_trainer_step: 4" in lines
    assert "  asyncrl_critic_score_mean: 0.625" in lines
    assert "  asyncrl_timing_s_step: 12.5" in lines
    assert not any("adapter_rows" in line for line in lines)  # only the gauges worth a glance


def test_steps_are_counted_as_kubectl_shows_them_and_the_last_steps_number_as_logs_do() -> None:
    """Issue 37 item 9: `status.step` 15 beside STEPS 16/16 read as a step short; the summary says both."""
    done = {
        **RUN,
        "spec": {"totalSteps": 16},
        "status": {"phase": "Succeeded", "step": 15, "progress": "16/16"},
    }
    lines = summary_lines(done, events=[], trainer=None, now=NOW)
    assert any(line.startswith("steps:          16/16 done; the last was step 15 ") for line in lines), lines
    open_ended = {**RUN, "spec": {}, "status": {"phase": "Running", "step": 0}}
    lines = summary_lines(open_ended, events=[], trainer=None, now=NOW)
    assert any(line.startswith("steps:          1 done; the last was step 0 ") for line in lines), lines
    lines = summary_lines({**open_ended, "status": {"phase": "Running"}}, events=[], trainer=None, now=NOW)
    assert "steps:          none done yet (open-ended: no spec.totalSteps)" in lines


def test_a_trainer_from_before_the_rename_is_shown_under_the_current_names() -> None:
    old_trainer = "\n".join(
        f"# TYPE {name} gauge\n{name} {value}"
        for name, value in (
            ("asyncrl_training_reward_mean", 0.25),
            ("asyncrl_timing_step_seconds", 3.5),
            ("asyncrl_training_update_loss", -0.5),
        )
    )
    gauges = parse_gauges(old_trainer + "\n")
    lines = summary_lines(RUN, events=[], trainer=TrainerMetrics(gauges=gauges, source="s"), now=NOW)
    assert "  asyncrl_critic_score_mean: 0.25" in lines
    assert "  asyncrl_timing_s_step: 3.5" in lines
    assert "  asyncrl_actor_pg_loss: -0.5" in lines


def test_a_trainer_without_a_step_and_an_unreachable_one_are_told_apart() -> None:
    empty = TrainerMetrics(
        gauges=parse_gauges(generate_latest(PrometheusSink().registry).decode()), source="s"
    )
    assert "  (no step logged yet)" not in summary_lines(
        RUN, events=[], trainer=empty, now=NOW
    )  # holding gauge
    fresh = TrainerMetrics(gauges={}, source="s")
    assert "  (no step logged yet)" in summary_lines(RUN, events=[], trainer=fresh, now=NOW)
    gone = TrainerMetrics(gauges={}, source="s", unavailable="503: no endpoints available")
    assert "trainer metrics (s): not reachable: 503: no endpoints available" in summary_lines(
        RUN, events=[], trainer=gone, now=NOW
    )


def test_repeated_events_show_their_count() -> None:
    event = EventLine(time=NOW, type="Warning", reason="AgentJobFailed", message="job r-1 failed", count=3)
    lines = summary_lines(RUN, events=[event], trainer=None, now=NOW)
    assert "  2026-01-02T12:00:00+00:00 Warning AgentJobFailed (x3): job r-1 failed" in lines


def test_a_refused_port_forward_is_reduced_to_the_api_servers_message() -> None:
    raw = (
        "Handshake status 404 Not Found -+-+- {'audit-id': 'x', 'content-type': 'application/json'} -+-+- "
        '{"kind":"Status","status":"Failure","message":"pods \\"n1\\" not found","code":404}'
    )
    assert _stream_reason(Exception(raw)) == '404 Not Found: pods "n1" not found'
    assert _stream_reason(OSError("connection refused")) == "connection refused"


def test_a_run_without_status_names_the_operator_that_does_not_watch_its_namespace() -> None:
    """Issue 37 item 7: such a run was blank, and the summary said only that no status was written."""
    from asyncrl.run_summary import OperatorWatch, operator_lines

    elsewhere = OperatorWatch("asyncrl-system", "asyncrl-operator", ("team-a", "team-b"))
    (line,) = operator_lines("team-c", [elsewhere])
    assert "asyncrl-system/asyncrl-operator watches only team-a, team-b, not team-c" in line
    assert "watch.namespaces" in line
    (serving,) = operator_lines("team-a", [elsewhere])
    assert "watches team-a but has not written a status: is it running?" in serving
    (everywhere,) = operator_lines("team-c", [OperatorWatch("ops", "asyncrl-operator", None)])
    assert "ops/asyncrl-operator watches team-c" in everywhere
    (none,) = operator_lines("team-c", [])
    assert "no asyncrl operator Deployment found" in none
    (unknown,) = operator_lines("team-c", None, "listing Deployments: 403: forbidden")
    assert "not looked up (listing Deployments: 403: forbidden)" in unknown
