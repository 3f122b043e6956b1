"""Settings for this suite: warnings are errors in its tests, and one
hypothesis profile.

Every warning the library gives (a ``RecoveryWarning`` above all) must be
expected where a test meets it, so an unexpected one fails the test; the rule
is set here, for the tests of this folder only, rather than in pyproject.toml,
where it would apply to any other suite run from the project (as would
``--strict-markers``, left out for the same reason).

The machine the suite runs on is shared and noisy (two cores), so no example
has a deadline and a slow data generator is not an error: a property fails
only on a wrong answer. Examples stay random from run to run (each CI run
explores new ones); a failure prints the blob that reproduces it.
"""
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "rune", deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("rune")


_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.filterwarnings("error"))
