"""Warm-standby sizing against the paper's examples."""

from __future__ import annotations

import pytest

from rankscope.recovery.standby import standby_count
from rankscope.spine import InputError


def test_reproduces_the_papers_p99_pool_sizes() -> None:
    # ByteRobust Table 5: P99 standbys 2, 2, 3, 4 for 128, 256, 512, 1024 machines ("4 backups for 1,024")
    for rate in (0.00118, 0.0012, 0.00122):
        assert [standby_count(n, rate).standby for n in (128, 256, 512, 1024)] == [2, 2, 3, 4]
    s = standby_count(1024, 0.0012)
    assert s.coverage >= 0.99 and abs(s.expected_failures - 1024 * 0.0012) < 1e-9


def test_pool_grows_with_rate_window_and_quantile() -> None:
    base = standby_count(1024, 0.0012).standby
    assert standby_count(1024, 0.005).standby > base
    assert standby_count(1024, 0.0012, window_hours=72).standby > base
    assert standby_count(1024, 0.0012, quantile=0.999).standby > base
    assert standby_count(1024, 0.0012, window_hours=1).standby < base
    assert standby_count(1, 0.0).standby == 0


def test_matches_a_direct_binomial_sum() -> None:
    from math import comb

    n, p = 64, 0.01
    s = standby_count(n, p)
    cdf = sum(comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(s.standby + 1))
    below = sum(comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(s.standby))
    assert cdf >= 0.99 > below


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"machines": 0}, "--machines"),
        ({"daily_failure_rate": 1.5}, "--daily"),
        ({"window_hours": 0}, "--window-hours"),
        ({"quantile": 1.0}, "--quantile"),
    ],
)
def test_bad_arguments_name_the_option(kw: dict[str, float], match: str) -> None:
    args = {"machines": 10, "daily_failure_rate": 0.001, **kw}
    with pytest.raises(InputError, match=match):
        standby_count(int(args.pop("machines")), args.pop("daily_failure_rate"), **args)  # type: ignore[arg-type]
