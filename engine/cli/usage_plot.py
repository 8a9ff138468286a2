"""``gangflow usage --plot FILE.png``: GPU use by tenant over time, and badput by cause.

Two panels from the same entries ``gangflow usage`` sums (one per distributed task call, with the ledger and
the time span of each finished attempt, engine.runtime.ledger): on top, the GPUs each tenant's attempts held,
stacked, over time (placement to release); below, per tenant, the GPU-hours that did not count, by cause. It
needs matplotlib (``pip install 'gangflow[plots]'``); without it ``--plot`` fails with that advice before any
run is read. Drawn without pyplot (a ``Figure`` and the Agg canvas): no window, no global state.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.core.protocol import BADPUT

__all__ = ["PLOTS_MISSING", "gpu_steps", "matplotlib_missing", "plot_usage"]

PLOTS_MISSING = "--plot needs matplotlib, which is not installed: pip install 'gangflow[plots]'"


def matplotlib_missing() -> bool:
    """Whether ``--plot`` cannot draw here (checked before any run is read)."""
    try:
        import matplotlib  # noqa: F401  (only whether it imports)
    except ImportError:
        return True
    return False


def gpu_steps(entries: Sequence[Mapping[str, Any]]) -> tuple[list[float], dict[str, list[float]]]:
    """GPUs held per tenant as a step function: the times where any attempt was placed or released (epoch
    seconds, sorted) and, per tenant, the GPUs held from each time to the next. Pure: the tests call it."""
    changes: dict[float, dict[str, float]] = {}
    for entry in entries:
        tenant = str(entry["tenant"])
        for start, end, gpus in entry.get("spans") or ():
            if end > start and gpus:
                changes.setdefault(float(start), {}).setdefault(tenant, 0.0)
                changes[float(start)][tenant] += gpus
                changes.setdefault(float(end), {}).setdefault(tenant, 0.0)
                changes[float(end)][tenant] -= gpus
    times = sorted(changes)
    tenants = sorted({t for delta in changes.values() for t in delta})
    held = dict.fromkeys(tenants, 0.0)
    series: dict[str, list[float]] = {t: [] for t in tenants}
    for time in times:
        for tenant, delta in changes[time].items():
            held[tenant] += delta
        for tenant in tenants:
            series[tenant].append(max(0.0, round(held[tenant], 6)))
    return times, series


def _held_until_next(values: list[float]) -> list[float]:
    """``v0, v0, v1, v1, ..., vn``: the values at the stepped times (each value again at the next change)."""
    return [v for value in values[:-1] for v in (value, value)] + values[-1:]


def _badput_by_tenant(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for entry in entries:
        ledger = entry.get("ledger")
        if not isinstance(ledger, Mapping):
            continue
        row = totals.setdefault(str(entry["tenant"]), dict.fromkeys(BADPUT, 0.0))
        for cause in BADPUT:
            row[cause] += float((ledger.get("badput") or {}).get(cause, 0.0))
    return totals


def plot_usage(entries: Sequence[Mapping[str, Any]], path: str | Path, title: str = "gangflow usage") -> Path:
    """Draw the two panels into ``path`` (PNG, or any format matplotlib knows by the suffix); return it.
    ImportError when matplotlib is missing (``matplotlib_missing`` tells beforehand)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    times, series = gpu_steps(entries)
    badput = _badput_by_tenant(entries)
    figure = Figure(figsize=(9, 6.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    use, bad = figure.subplots(2, 1, height_ratios=[3, 2])
    figure.suptitle(title)
    if times:
        # a step function drawn as a stacked area: each value holds until the next change
        xs = [dt.datetime.fromtimestamp(t, tz=dt.UTC) for t in times]
        stepped_x = [x for pair in itertools.pairwise(xs) for x in pair] + [xs[-1]]
        stacked = [_held_until_next(values) for values in series.values()]
        use.stackplot(stepped_x, *stacked, labels=list(series), alpha=0.85)
        use.tick_params(axis="x", labelrotation=15)  # matplotlib's own date ticks for datetimes
        use.legend(loc="upper left", fontsize="small", title="tenant")
    else:
        use.text(0.5, 0.5, "no finished gang attempts", ha="center", va="center", transform=use.transAxes)
    use.set_ylabel("GPUs held")
    use.set_title("GPU use by tenant (placement to release, UTC)", fontsize="medium")
    tenants = sorted(badput)
    causes = [c for c in BADPUT if any(badput[t][c] for t in tenants)]
    left = [0.0] * len(tenants)
    for cause in causes:
        hours = [badput[t][cause] / 3600 for t in tenants]
        bad.barh(tenants, hours, left=left, label=cause)
        left = [a + b for a, b in zip(left, hours, strict=True)]
    if causes:
        bad.legend(loc="best", fontsize="small", title="cause", ncols=2)
    else:
        bad.text(0.5, 0.5, "no badput", ha="center", va="center", transform=bad.transAxes)
    bad.set_xlabel("badput, GPU-hours")
    bad.set_title("badput by cause", fontsize="medium")
    out = Path(path)
    figure.savefig(out)
    return out
