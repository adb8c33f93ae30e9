"""Shared settings of the hostile-input tests (see each module's docstring).

``HOSTILE_FULL=1`` selects the full setting: thousands of schemathesis cases and longer
Hypothesis runs. Unset (CI), every test here is bounded and derandomized.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

FULL = os.environ.get("HOSTILE_FULL", "").strip().lower() not in ("", "0", "false", "no")


def fuzz_settings(ci_examples: int, full_examples: int, **kw) -> settings:
    """Hypothesis settings: few, derandomized examples in CI; many, random ones with HOSTILE_FULL=1."""
    return settings(
        max_examples=full_examples if FULL else ci_examples,
        derandomize=not FULL,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.filter_too_much, HealthCheck.data_too_large],
        print_blob=True,
        **kw,
    )


@pytest.fixture
def no_rate_limit(settings):
    """The per-analyst request-creation limit would answer most fuzzed POSTs with 429."""
    settings.REQUEST_RATE_LIMIT = ""
    from django.core.cache import cache

    cache.clear()
