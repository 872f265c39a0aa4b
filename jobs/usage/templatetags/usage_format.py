"""`{{ value|hours }}`: GPU- and CPU-hours as jobs.usage.measure.hours_text writes them (one definition)."""

from __future__ import annotations

from django import template

from jobs.usage import measure

register = template.Library()


@register.filter
def hours(value: float | None) -> str:
    return "" if value is None else measure.hours_text(float(value))
