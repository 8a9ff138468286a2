"""Checking a schedule's cron expressions and durations before Temporal sees them (pure: no Temporal).

Temporal reads cron expressions as robfig/cron does, plus a year field: 5 fields (minute hour day-of-month
month day-of-week), 6 (… year) or 7 (second … year); ``@daily``-style shortcuts and ``@every 90m``; an
optional ``CRON_TZ=Europe/Paris`` prefix. This check refuses what is certainly wrong (a field out of range,
a wrong number of fields, an unknown name), naming the expression and the field; anything subtler is left to
Temporal, whose refusal is reported the same way (``engine.client.Schedules``).
"""

from __future__ import annotations

import re
from datetime import timedelta

from engine.errors import InputError

__all__ = ["check_cron", "parse_duration"]

_SHORTCUTS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
#: field name, lowest and highest value, names (for months and days of the week)
_Field = tuple[str, int, int, dict[str, int]]
_SECOND: _Field = ("second", 0, 59, {})
_MINUTE: _Field = ("minute", 0, 59, {})
_HOUR: _Field = ("hour", 0, 23, {})
_DOM: _Field = ("day of month", 1, 31, {})
_MONTH: _Field = ("month", 1, 12, {name: i + 1 for i, name in enumerate(_MONTHS)})
_DOW: _Field = ("day of week", 0, 7, {name: i for i, name in enumerate(_DAYS)})  # 7 is Sunday too
_YEAR: _Field = ("year", 1970, 2999, {})
_LAYOUTS: dict[int, tuple[_Field, ...]] = {
    5: (_MINUTE, _HOUR, _DOM, _MONTH, _DOW),
    6: (_MINUTE, _HOUR, _DOM, _MONTH, _DOW, _YEAR),
    7: (_SECOND, _MINUTE, _HOUR, _DOM, _MONTH, _DOW, _YEAR),
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, option: str = "duration") -> timedelta:
    """``90s``, ``30m``, ``1h30m``, ``1d``, ``2w`` → timedelta (InputError naming ``option`` otherwise)."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise InputError(f"{option} {text!r} is not a duration; expected e.g. 90s, 30m, 1h30m, 1d")
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def _value(token: str, spec: _Field, expr: str) -> int:
    name, low, high, names = spec
    if token.lower() in names:
        return names[token.lower()]
    if not token.isdigit():
        known = f" or a name ({', '.join(names)})" if names else ""
        raise InputError(f"cron {expr!r}: {name} {token!r} is not a number from {low} to {high}{known}")
    value = int(token)
    if not low <= value <= high:
        raise InputError(f"cron {expr!r}: {name} {value} is out of range ({low}-{high})")
    return value


def _check_field(text: str, spec: _Field, expr: str) -> None:
    name = spec[0]
    for item in text.split(","):
        span, slash, step = item.partition("/")
        if slash and not (step.isdigit() and int(step) > 0):
            raise InputError(f"cron {expr!r}: {name} step {step!r} is not a positive number")
        if span == "*":  # Temporal takes no "?"
            continue
        first, dash, last = span.partition("-")
        if not first:
            raise InputError(f"cron {expr!r}: {name} {item!r} is empty or malformed")
        start = _value(first, spec, expr)
        if dash and _value(last, spec, expr) < start:
            raise InputError(f"cron {expr!r}: {name} range {span!r} ends before it starts")


def check_cron(expr: str) -> str:
    """A cron expression as Temporal reads it (see the module docstring), whitespace normalized, or
    InputError naming it and what is wrong."""
    text = " ".join(str(expr).split())
    body = text
    if body.upper().startswith(("CRON_TZ=", "TZ=")):
        _, _, body = body.partition(" ")
    if not body:
        raise InputError(f"cron {expr!r} is empty; expected e.g. '0 3 * * *' (03:00 every day)")
    if body.startswith("@"):
        word, _, rest = body.partition(" ")
        if word == "@every":
            try:
                every = parse_duration(rest.partition("/")[0], f"cron {expr!r}: @every")
            except InputError as exc:
                raise InputError(str(exc)) from None
            if every <= timedelta(0):
                raise InputError(f"cron {expr!r}: @every needs a positive duration")
        elif word not in _SHORTCUTS or rest:
            raise InputError(
                f"cron {expr!r}: unknown shortcut; expected one of {', '.join(sorted(_SHORTCUTS))}, @every"
            )
        return text
    fields = body.split(" ")
    layout = _LAYOUTS.get(len(fields))
    if layout is None:
        raise InputError(
            f"cron {expr!r} has {len(fields)} fields; expected 5 (minute hour day-of-month month day-of-week), "
            "6 (… year) or 7 (second … year)"
        )
    for part, spec in zip(fields, layout, strict=True):
        _check_field(part, spec, text)
    return text
