"""The trainer's metrics port over real HTTP on 127.0.0.1: Prometheus' /metrics and the per-step history
that `asyncrl runs plot` fetches (through the API server's Service proxy on a cluster; that hop needs a pod
network, which the test control plane lacks, so here the port is asked directly)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.launch.processes import free_port
from asyncrl.trainer.metrics import JsonLinesSink, PrometheusSink
from asyncrl.trainer.metrics_server import HISTORY_PATH, serve_metrics


@pytest.fixture
def sink() -> PrometheusSink:
    return PrometheusSink()


def _serve(sink: PrometheusSink, history: Path | None) -> Iterator[str]:
    port = free_port()
    server = serve_metrics(port, sink.registry, history, host="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_history_is_the_metrics_file_and_metrics_stay_prometheus(
    sink: PrometheusSink, tmp_path: Path
) -> None:
    history = tmp_path / "metrics" / "metrics.jsonl"
    for url in _serve(sink, history):
        missing = httpx.get(url + HISTORY_PATH)
        assert missing.status_code == 404
        assert "no step has finished yet" in missing.text
        lines = JsonLinesSink(history)
        for step in range(3):
            metrics = {"critic/score/mean": step / 4, "timing_s/step": 1.5}
            lines.log(step, metrics)
            sink.log(step, metrics)
        lines.close()
        served = httpx.get(url + HISTORY_PATH)
        assert served.status_code == 200
        assert served.headers["content-type"] == "application/x-ndjson"
        assert [json.loads(line)["step"] for line in served.text.splitlines()] == [0, 1, 2]
        assert served.text == history.read_text()
        scrape = httpx.get(url + "/metrics")
        assert scrape.status_code == 200
        assert "asyncrl_critic_score_mean 0.5" in scrape.text


def test_a_trainer_without_a_metrics_file_says_why(sink: PrometheusSink) -> None:
    for url in _serve(sink, None):
        answer = httpx.get(url + HISTORY_PATH)
        assert answer.status_code == 404
        assert "no per-step metrics file" in answer.text
