"""The usage page's pictures as plain geometry (server-rendered SVG: no chart library to ship, load or keep
up; the page stays readable without JavaScript). Pure: rows in, shapes out; the template draws them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Final

from jobs.usage import measure

# A palette that stays apart for the common colour-vision deficiencies (Okabe and Ito).
PALETTE: Final = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
OTHERS: Final = "others"
MAX_SERIES: Final = 7  # the largest groups by total, then one "others"
WIDTH: Final = 420.0  # the viewBox: scaled to the card, so a phone shows it at about 0.8
HEIGHT: Final = 180.0
AXIS: Final = 40.0  # left margin for the scale's labels


@dataclass(frozen=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str  # the tooltip: series, period, value


@dataclass(frozen=True)
class Legend:
    name: str
    color: str
    total: float


@dataclass(frozen=True)
class StackedBars:
    width: float
    height: float
    segments: list[Segment]
    legend: list[Legend]
    top: float  # the scale's top value
    ticks: list[tuple[float, str]]  # (y, label)
    labels: list[tuple[float, str]]  # (x, period) under the bars
    empty: bool = False


@dataclass(frozen=True)
class Share:
    name: str
    value: float
    percent: float
    color: str
    x: float = 0.0
    width: float = 0.0


@dataclass(frozen=True)
class Shares:
    parts: list[Share] = field(default_factory=list)
    total: float = 0.0


def _nice(value: float) -> float:
    """The scale's top: 1, 2 or 5 times a power of ten at or above value."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-9))


def _series(totals: Mapping[str, float]) -> list[str]:
    ranked = sorted(totals, key=lambda k: (-totals[k], k))
    return ranked[:MAX_SERIES] + ([OTHERS] if len(ranked) > MAX_SERIES else [])


def stacked_bars(
    rows: Sequence[Mapping[str, Any]], *, key: str, value: str, periods: Sequence[date]
) -> StackedBars:
    """One bar per period, stacked by the rows' `key` (the largest groups, then the rest as "others")."""
    per: dict[tuple[date, str], float] = {}
    totals: dict[str, float] = {}
    for row in rows:
        name = str(row.get(key) or "-")
        amount = float(row.get(value) or 0.0)
        totals[name] = totals.get(name, 0.0) + amount
        per[(row["period"], name)] = per.get((row["period"], name), 0.0) + amount
    series = _series(totals)
    kept = set(series)
    folded: dict[tuple[date, str], float] = {}
    for (period, name), amount in per.items():
        place = (period, name if name in kept else OTHERS)
        folded[place] = folded.get(place, 0.0) + amount
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    heights = [sum(folded.get((p, s), 0.0) for s in series) for p in periods]
    top = _nice(max(heights, default=0.0))
    slot = (WIDTH - AXIS) / max(len(periods), 1)
    bar = max(slot * 0.7, 1.0)
    segments: list[Segment] = []
    for i, period in enumerate(periods):
        y = HEIGHT
        for name in series:
            amount = folded.get((period, name), 0.0)
            if amount <= 0:
                continue
            h = HEIGHT * amount / top
            y -= h
            title = f"{name}, {period}: {measure.hours_text(amount)}"
            segments.append(Segment(AXIS + i * slot + (slot - bar) / 2, y, bar, h, colors[name], title))
    ticks = [(HEIGHT - HEIGHT * f, f"{top * f:g}") for f in (0.0, 0.5, 1.0)]
    every = max(1, len(periods) // 6)  # at most about seven labels under the bars
    labels = [
        (AXIS + i * slot + slot / 2, day.strftime("%m-%d")) for i, day in enumerate(periods) if i % every == 0
    ]
    folded_totals = {name: sum(a for (_, n), a in folded.items() if n == name) for name in series}
    return StackedBars(
        width=WIDTH,
        height=HEIGHT,
        segments=segments,
        legend=[Legend(name, colors[name], folded_totals[name]) for name in series],
        top=top,
        ticks=ticks,
        labels=labels,
        empty=not segments,
    )


def shares(amounts: Mapping[str, float]) -> Shares:
    """Each part's share of the whole, laid along one 100 % bar (the largest first)."""
    total = sum(v for v in amounts.values() if v > 0)
    if total <= 0:
        return Shares()
    parts, x = [], 0.0
    named = sorted((k for k, v in amounts.items() if v > 0), key=lambda k: (-amounts[k], k))
    for i, name in enumerate(named):
        percent = 100.0 * amounts[name] / total
        parts.append(Share(name, amounts[name], percent, PALETTE[i % len(PALETTE)], x, percent))
        x += percent
    return Shares(parts, total)
