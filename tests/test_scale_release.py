"""benchmarks/scale.py's release breakdown on made-up observations: which of the trainer's requests ran while
calls released by a resume were still being answered."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    return load_benchmark("scale")


def test_each_resume_window_ends_at_the_last_answer_it_released(scale: ModuleType) -> None:
    resumes = [10.0, 20.0]
    calls = [
        (9.0, 10.05),  # held through the first resume
        (9.5, 10.12),  # its last
        (10.5, 10.6),  # never held
        (19.0, 20.03),  # the second resume's only one
    ]
    windows = scale.release_windows(calls, resumes)
    assert windows == [(10.0, 10.12), (20.0, 20.03)]
    assert scale.release_seconds(calls, resumes) == pytest.approx([0.05, 0.12, 0.03])


def test_only_the_time_a_request_overlaps_a_release_window_counts_and_the_long_poll_not_at_all(
    scale: ModuleType,
) -> None:
    span = scale.RequestSpan
    spans = [
        span(scale.request_kind("POST", "/api/rollouts/delete"), 10.01, 10.09),  # 80 ms, all inside
        span(scale.request_kind("POST", "/api/rollouts/events"), 10.10, 10.30),  # 20 ms of it inside
        span(scale.request_kind("PUT", "/api/window/summary"), 11.0, 11.1),  # after the window
        span(scale.request_kind("GET", "/api/completions"), 9.0, 12.0),  # the long-poll
        span(scale.request_kind("POST", "/proxy/resume"), 9.99, 10.0),  # ends as the window starts
    ]
    work = scale.trainer_work_in_release(spans, [(10.0, 10.12)])
    assert list(work) == ["delete", "events"]
    assert work["delete"][0] == 1
    assert work["delete"][1] == pytest.approx(0.08)
    assert work["events"][1] == pytest.approx(0.02)
