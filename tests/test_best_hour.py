"""campaigns.besthour: the pure estimator (no database)."""

from __future__ import annotations

import math
import random

import pytest

from campaigns.besthour import (
    best_hour,
    best_hour_fast,
    ordered_window,
    prepared_prior,
    smooth,
    window_hours,
)


def bins(**weights: float) -> list[float]:
    """A 24-bin histogram from h<hour>=weight keywords."""
    histogram = [0.0] * 24
    for key, value in weights.items():
        histogram[int(key[1:])] = value
    return histogram


# A two-peak population: 08:00 (the larger) and 20:00.
POPULATION = [1.0] * 24
POPULATION[7], POPULATION[8], POPULATION[9] = 20.0, 40.0, 20.0
POPULATION[19], POPULATION[20], POPULATION[21] = 15.0, 30.0, 15.0


def test_no_contact_history_gives_the_population_peak() -> None:
    assert best_hour(None, POPULATION, k=5) == 8
    assert best_hour([0.0] * 24, POPULATION, k=5) == 8


def test_no_population_and_no_history_gives_ten_local() -> None:
    assert best_hour(None, None, k=5) == 10
    assert best_hour([0.0] * 24, [0.0] * 24, k=5) == 10


def test_no_data_and_ten_outside_the_window_gives_the_windows_first_hour() -> None:
    assert best_hour(None, None, k=5, window=window_hours(22, 6)) == 22


def test_no_history_takes_the_population_peak_inside_the_window() -> None:
    assert best_hour(None, POPULATION, k=5, window=range(12, 24)) == 20


def test_infinite_prior_strength_gives_the_population_argmax_in_the_window() -> None:
    contact = bins(h3=1000.0)
    assert best_hour(contact, POPULATION, k=math.inf) == 8
    assert best_hour(contact, POPULATION, k=1e12, window=range(12, 24)) == 20
    assert best_hour(contact, POPULATION, k=math.inf, window=range(12, 24)) == 20


def test_zero_prior_strength_with_one_dominant_bin_gives_that_bin() -> None:
    contact = bins(h14=9.0, h8=1.0, h20=1.0)
    assert best_hour(contact, POPULATION, k=0) == 14


def test_few_events_are_shrunk_toward_the_population_many_are_not() -> None:
    assert best_hour(bins(h14=1.0), POPULATION, k=5) == 8  # one open does not beat the prior
    assert best_hour(bins(h14=30.0), POPULATION, k=5) == 14


def test_smoothing_prefers_a_cluster_over_a_lone_spike() -> None:
    # 06:00, 07:00 and 05:00 together beat a single larger 17:00 bin once neighbours count.
    contact = bins(h5=2.0, h6=3.0, h7=2.0, h17=3.5)
    assert best_hour(contact, None, k=0, smoothing=(1.0,)) == 17
    assert best_hour(contact, None, k=0) == 6


def test_smoothing_wraps_midnight() -> None:
    assert smooth(bins(h0=4.0)) == pytest.approx(bins(h23=1.0, h0=2.0, h1=1.0))
    contact = bins(h23=2.0, h0=2.0, h1=2.0, h12=2.5)
    assert best_hour(contact, None, k=0) == 0


def test_the_window_is_honoured() -> None:
    contact = bins(h3=10.0, h15=2.0)
    assert best_hour(contact, POPULATION, k=0, window=range(9, 18)) == 15
    assert best_hour(contact, POPULATION, k=0, window={15, 16}) == 15


def test_a_window_wrapping_midnight_is_honoured() -> None:
    contact = bins(h12=10.0, h23=3.0, h2=4.0)
    window = window_hours(22, 6)  # 22:00 .. 03:59
    assert window == (22, 23, 0, 1, 2, 3)
    assert best_hour(contact, POPULATION, k=0, window=window) == 2
    assert best_hour(bins(h12=10.0), POPULATION, k=0, window=window) in window


def test_ties_go_to_the_first_hour_of_the_window() -> None:
    assert best_hour(bins(h2=1.0, h10=1.0), None, k=0, window=window_hours(8, 24)) == 10
    assert best_hour(bins(h2=1.0, h10=1.0), None, k=0) == 2


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        best_hour([1.0] * 23, None, k=1)
    with pytest.raises(ValueError):
        best_hour([-1.0] + [0.0] * 23, None, k=1)
    with pytest.raises(ValueError):
        best_hour(None, [math.nan] * 24, k=1)
    with pytest.raises(ValueError):
        best_hour(None, None, k=-1)
    with pytest.raises(ValueError):
        best_hour(None, None, k=1, window=[])
    with pytest.raises(ValueError):
        best_hour(None, None, k=1, window=[24])
    with pytest.raises(ValueError):
        window_hours(3, 0)


def test_the_fast_form_answers_what_best_hour_answers() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        population = [rng.random() * 10 for _ in range(24)] if rng.random() < 0.9 else None
        contact = [rng.random() * 3 if rng.random() < 0.3 else 0.0 for _ in range(24)]
        contact[rng.randrange(24)] += 0.5
        k = rng.choice([0.0, 1.0, 5.0, 50.0])
        window = ordered_window(window_hours(rng.randrange(24), rng.randint(1, 24)))
        expected = best_hour(contact, population, k=k, window=window)
        assert best_hour_fast(contact, prepared_prior(population, k=k), window) == expected
