"""Hypothesis settings for the whole suite.

The machine the suite runs on is shared and noisy (two cores), so no example
has a deadline and a slow data generator is not an error: a property fails
only on a wrong answer. Examples stay random from run to run (each CI run
explores new ones); a failure prints the blob that reproduces it.
"""
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "rune", deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("rune")


# What the fault suites counted (crash states checked and held), printed at
# the end of every run, CI's included: a passing test's output is captured.
_SUMMARY: list[str] = []


@pytest.fixture
def summary_line(request):
    """Call with a line to print in the run's closing summary (carried in
    the test's report, so that it reaches the summary from pytest-xdist's
    workers too)."""
    return lambda line: request.node.user_properties.append(("fault suites", line))


def pytest_runtest_logreport(report):
    if report.when == "call":
        _SUMMARY.extend(v for k, v in report.user_properties if k == "fault suites")


def pytest_terminal_summary(terminalreporter):
    if _SUMMARY:
        terminalreporter.section("fault suites")
        for line in _SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _no_idle_watcher(request, monkeypatch):
    """No idle watcher (tuning.IDLE_MERGE_SECONDS) unless a test asks for it
    with the ``idle_work`` marker: the suite's schedules are exact (a test
    counts files or jobs between its own calls), and a watcher waking on a
    loaded machine would move them between two lines. The stores that
    child processes open keep the default."""
    if request.node.get_closest_marker("idle_work") is None:
        from rune_fast._conv import tuning
        monkeypatch.setattr(tuning, "IDLE_MERGE_SECONDS", None)
