"""A contact's best hour to receive mail: pure arithmetic over 24 local-hour bins, no Django.

The estimator (docs/scheduling.md, "Send-time optimization" has the reasoning and the figures):

1. **Shrinkage.** The contact's decayed weights `c` (human opens and clicks, clicks weighted
   more) are combined with the population's distribution `π` (its histogram normalised) as
   `c + k·π`: the posterior mean of a Dirichlet prior of strength `k` centred on the
   population. A contact with two opens barely moves from the population's shape; one with
   thirty is nearly their own. `k` is in event-weight units (k=5: the population counts as
   five opens).
2. **Circular smoothing.** Opens scatter around a habit by an hour or two, so a 24-bin
   histogram of ten events is noisy; a small kernel (default [0.25, 0.5, 0.25]) spreads each
   bin onto its neighbours, wrapping 23 ↔ 0, before the peak is taken.
3. **Window.** The argmax is taken only over the allowed local hours (a campaign's window, which
   may wrap midnight); ties go to the hour met first in the window's order.

Fallbacks: no contact history → the population's (smoothed) peak inside the window; no
population data either → 10:00 local if allowed, else the window's first hour.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

HOURS = 24
DEFAULT_HOUR = 10
DEFAULT_SMOOTHING: tuple[float, ...] = (0.25, 0.5, 0.25)


def window_hours(start_hour: int, hours: int) -> tuple[int, ...]:
    """The local hours of a window of `hours` hours starting at `start_hour`, wrapping midnight."""
    if not 0 <= start_hour < HOURS:
        raise ValueError(f"start_hour must be 0..23, not {start_hour}")
    if not 1 <= hours <= HOURS:
        raise ValueError(f"hours must be 1..24, not {hours}")
    return tuple((start_hour + i) % HOURS for i in range(hours))


def ordered_window(window: Collection[int] | None) -> tuple[int, ...]:
    if window is None:
        return tuple(range(HOURS))
    # A set has no order of its own: ascending hours. A sequence (range, tuple, list) keeps its
    # order, which is how a window wrapping midnight says that 22:00 comes before 01:00.
    order = sorted(window) if isinstance(window, set | frozenset) else list(window)
    seen: list[int] = []
    for hour in order:
        if not isinstance(hour, int) or not 0 <= hour < HOURS:
            raise ValueError(f"window hours must be integers 0..23, not {hour!r}")
        if hour not in seen:
            seen.append(hour)
    if not seen:
        raise ValueError("the window allows no hour")
    return tuple(seen)


def smooth(values: Sequence[float], kernel: Sequence[float] = DEFAULT_SMOOTHING) -> list[float]:
    """Circular convolution of 24 bins with an odd-length kernel centred on each bin."""
    if len(kernel) % 2 != 1:
        raise ValueError("the smoothing kernel must have an odd length")
    half = len(kernel) // 2
    n = len(values)
    return [
        sum(weight * values[(h + offset - half) % n] for offset, weight in enumerate(kernel))
        for h in range(n)
    ]


def _check(histogram: Sequence[float] | None, name: str) -> list[float]:
    if histogram is None:
        return [0.0] * HOURS
    if len(histogram) != HOURS:
        raise ValueError(f"{name} must have 24 bins, not {len(histogram)}")
    values = [float(v) for v in histogram]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"{name} must hold finite non-negative weights")
    return values


def _argmax(scores: Sequence[float], order: Sequence[int]) -> int:
    best = order[0]
    for hour in order[1:]:
        if scores[hour] > scores[best]:
            best = hour
    return best


def best_hour(
    contact_histogram: Sequence[float] | None,
    population_histogram: Sequence[float] | None,
    *,
    k: float,
    window: Collection[int] | None = None,
    smoothing: Sequence[float] = DEFAULT_SMOOTHING,
) -> int:
    """The local hour (0..23) to send to this contact, inside `window` (None: any hour)."""
    if not (k >= 0):  # also refuses NaN
        raise ValueError(f"k must be >= 0, not {k}")
    order = ordered_window(window)
    contact = _check(contact_histogram, "contact_histogram")
    population = _check(population_histogram, "population_histogram")
    contact_total, population_total = sum(contact), sum(population)
    if population_total <= 0:
        if contact_total <= 0:
            return DEFAULT_HOUR if DEFAULT_HOUR in order else order[0]
        prior = [1.0 / HOURS] * HOURS  # no population yet: a flat prior
    else:
        prior = [v / population_total for v in population]
    if contact_total <= 0 or math.isinf(k):
        posterior = prior
    else:
        posterior = [c + k * p for c, p in zip(contact, prior, strict=True)]
    return _argmax(smooth(posterior, smoothing), order)


def prepared_prior(population_histogram: Sequence[float] | None, *, k: float) -> list[float] | None:
    """k·π, smoothed: the part of every contact's score that is the same for all of them.

    Smoothing is linear, so smooth(c + k·π) = smooth(c) + smooth(k·π); computing the second term
    once per population makes a pass over 20,000 contacts cost one small smoothing each.
    """
    population = _check(population_histogram, "population_histogram")
    total = sum(population)
    if total <= 0:
        return None
    return smooth([k * v / total for v in population])


def best_hour_fast(
    contact_histogram: Sequence[float],
    prior: Sequence[float] | None,
    order: Sequence[int] = tuple(range(HOURS)),
) -> int:
    """best_hour with the default kernel for a contact with history, given prepared_prior().

    The vectorised form the refresh and fan-out use over a whole step; it answers exactly what
    best_hour answers with the default smoothing and a finite k (tests compare the two).
    """
    c = contact_histogram
    if prior is None:
        prior = [0.0] * HOURS  # a flat prior adds the same to every hour: it moves no argmax
    scores = [
        0.25 * c[(h - 1) % HOURS] + 0.5 * c[h] + 0.25 * c[(h + 1) % HOURS] + prior[h] for h in range(HOURS)
    ]
    return _argmax(scores, order)
