"""A campaign's engagement report: human open and click rates, the other hit classes counted
apart, feedback counters, and for `optimized` campaigns the lift over the holdout group.

Rates are per message sent: a message counts as opened once (its first human open, or its first
human click: a reader whose client blocks images still clicked), whatever number of hits it
drew. Machine, proxy, bot and scanner hits are counted as hits, never as opens or clicks.

Lift, for an optimized campaign: the optimized group's rate minus the holdout's (the holdout is
sent at the window's start, see campaigns.optimized), with a 95% interval by Newcombe's hybrid
score method (his method 10: Wilson intervals of each rate, combined), which keeps its coverage
at rates near 0 and at small n, where the plain normal (Wald) interval does not; and the ratio of
the two rates with the Katz log interval (none when either group has no event).
"""

from __future__ import annotations

from math import exp, sqrt
from statistics import NormalDist
from typing import Any

from campaigns.models import Campaign
from delivery import selectors as delivery_selectors

Z95 = NormalDist().inv_cdf(0.975)
CLASSES = ("human", "machine", "proxy", "bot", "scanner", "")


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ((0, 1) for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(x1: int, n1: int, x2: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """Newcombe's hybrid score interval (method 10, 1998) of p1 - p2."""
    p1, p2 = (x1 / n1 if n1 else 0.0), (x2 / n2 if n2 else 0.0)
    l1, u1 = wilson(x1, n1, z)
    l2, u2 = wilson(x2, n2, z)
    difference = p1 - p2
    return (
        difference - sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
        difference + sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2),
    )


def ratio_interval(x1: int, n1: int, x2: int, n2: int, z: float = Z95) -> tuple[float, float] | None:
    """Katz's log interval of p1 / p2; None when a count is 0 (the log is undefined)."""
    if 0 in (x1, x2, n1, n2):
        return None
    ratio = (x1 / n1) / (x2 / n2)
    spread = z * sqrt(1 / x1 - 1 / n1 + 1 / x2 - 1 / n2)
    return ratio * exp(-spread), ratio * exp(spread)


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _lift(x1: int, n1: int, x2: int, n2: int) -> dict[str, Any]:
    p1, p2 = _rate(x1, n1), _rate(x2, n2)
    if p1 is None or p2 is None:
        return {"difference": None, "difference_ci95": None, "ratio": None, "ratio_ci95": None}
    ratio_ci = ratio_interval(x1, n1, x2, n2)
    return {
        "difference": p1 - p2,
        "difference_ci95": list(newcombe_difference(x1, n1, x2, n2)),
        "ratio": p1 / p2 if p2 else None,
        "ratio_ci95": list(ratio_ci) if ratio_ci else None,
    }


def campaign_report(campaign: Campaign) -> dict[str, Any]:
    """The report of GET /api/v1/campaigns/{id}/report and the campaign admin page."""
    optimized = campaign.schedule_type == Campaign.ScheduleType.OPTIMIZED
    groups = delivery_selectors.campaign_engagement_groups(
        campaign.pk, campaign.holdout_percent if optimized else 0
    )
    delivered, hits = delivery_selectors.campaign_hits(campaign.pk)
    sent = sum(g["sent"] for g in groups.values())
    opened = sum(g["opened"] for g in groups.values())
    clicked = sum(g["clicked"] for g in groups.values())
    report: dict[str, Any] = {
        "campaign": campaign.pk,
        "schedule_type": campaign.schedule_type,
        "sent": sent,
        "delivered": delivered,
        "opened": opened,
        "open_rate": _rate(opened, sent),
        "clicked": clicked,
        "click_rate": _rate(clicked, sent),
        # Every hit, by who made it (`unclassified`: recorded before classification existed).
        "open_hits": {cls or "unclassified": hits.get(("opened", cls), 0) for cls in CLASSES},
        "click_hits": {cls or "unclassified": hits.get(("clicked", cls), 0) for cls in CLASSES},
        "bounced": campaign.bounced_count,
        "complained": campaign.complained_count,
        "unsubscribed": campaign.unsubscribed_count,
        "lift": None,
    }
    if optimized:
        treated, held = groups.get(False, _EMPTY), groups.get(True, _EMPTY)
        report["lift"] = {
            "holdout_percent": campaign.holdout_percent,
            "method": "difference: Newcombe hybrid score (Wilson) 95% interval; ratio: Katz log 95% interval",
            "optimized": _group(treated),
            "holdout": _group(held),
            "open_rate": _lift(treated["opened"], treated["sent"], held["opened"], held["sent"]),
            "click_rate": _lift(treated["clicked"], treated["sent"], held["clicked"], held["sent"]),
        }
    return report


_EMPTY = {"sent": 0, "opened": 0, "clicked": 0}


def _group(counts: dict[str, int]) -> dict[str, Any]:
    return {
        "sent": counts["sent"],
        "opened": counts["opened"],
        "open_rate": _rate(counts["opened"], counts["sent"]),
        "clicked": counts["clicked"],
        "click_rate": _rate(counts["clicked"], counts["sent"]),
    }
