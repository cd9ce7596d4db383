"""When the sync runs next, and when a probation fails: the pure parts of the daemon's sync."""

from __future__ import annotations

import random

import pytest

from edged.core.repository.manager import ModelHealth, VersionHealth
from edged.core.repository.probation import ProbationLimits, _problem
from edged.sync.agent import FIRST_RETRY_S, JITTER, next_delay


def test_the_interval_is_spread_around_its_value() -> None:
    rng = random.Random(7)
    delays = [next_delay(300.0, 0, rng.uniform) for _ in range(2000)]
    assert min(delays) >= 300 * (1 - JITTER) and max(delays) <= 300 * (1 + JITTER)
    assert max(delays) - min(delays) > 300 * JITTER  # spread, not one value


def test_failures_back_off_exponentially_up_to_the_interval() -> None:
    highest = [next_delay(300.0, failures, lambda _low, high: high) for failures in range(1, 10)]
    assert highest == [min(300.0, FIRST_RETRY_S * 2**n) for n in range(9)]
    lowest = [next_delay(300.0, failures, lambda low, _high: low) for failures in range(1, 10)]
    assert lowest == [value / 2 for value in highest]
    assert next_delay(2.0, 5, lambda _low, high: high) == 2.0  # never longer than the interval


LIMITS = ProbationLimits(window_s=1, max_error_rate=0.1, min_requests=10)


def health(ready: bool = True, **versions: tuple[int, int, int]) -> ModelHealth:
    return ModelHealth(ready, 0, {int(key[1:]): VersionHealth(*counts) for key, counts in versions.items()})


@pytest.mark.parametrize(
    ("before", "now", "problem"),
    [
        (health(v1=(5, 0, 0)), health(v1=(50, 2, 0)), None),  # 2 of 47: within 10%
        (health(v1=(5, 0, 0)), health(v1=(10, 6, 0)), "6 of 11 requests failed"),
        (health(v1=(0, 0, 0)), health(v1=(0, 5, 0)), None),  # too few requests to judge
        (health(v1=(0, 0, 0)), health(False, v1=(0, 0, 1)), "1 instance process(es) died"),
        (health(v1=(0, 0, 0)), health(False, v1=(0, 0, 0)), "it is not ready"),
        # A version loaded after the first look counts from zero, not against the one it replaced.
        (health(v1=(1000, 0, 4)), health(v2=(3, 0, 1)), "1 instance process(es) died"),
        (health(v1=(1000, 0, 0)), health(v2=(0, 12, 0)), "12 of 12 requests failed"),
    ],
)
def test_what_fails_a_probation(before: ModelHealth, now: ModelHealth, problem: str | None) -> None:
    found = _problem(before, now, LIMITS)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem)), found
