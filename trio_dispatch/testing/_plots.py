"""What every plot comparing policies shares: their styles, and readable axes.

Every policy is drawn so that it shows where lines coincide: the references
(FIFO, oldest-first...) in fixed styles, later ones thinner and on top;
anything else (a configuration of one's own) in styles of its own, each
with a marker and a dash pattern of its own.
"""

from __future__ import annotations

import math
from typing import Any

# Drawn in this order, later ones on top and thinner, so that a line on
# another still shows.
_STYLES: dict[str, dict[str, object]] = {
    "none": {"color": "tab:gray", "marker": "s", "linestyle": ":", "markersize": 7},
    "random": {"color": "tab:green", "marker": "^", "linestyle": "-.", "markersize": 7},
    "fifo": {
        "color": "tab:orange",
        "marker": "o",
        "linestyle": "-",
        "markersize": 10,
        "linewidth": 3.5,
        "alpha": 0.8,
    },
    "oldest-first": {
        "color": "tab:blue",
        "marker": "o",
        "linestyle": "--",
        "markersize": 4,
        "linewidth": 1.6,
    },
}


#: The styles of policies ``_STYLES`` does not know (a configuration of
#: one's own), in turn: each stands out from the references and the others.
_OTHERS: tuple[dict[str, object], ...] = (
    {"color": "tab:red", "marker": "D", "linestyle": "-", "markersize": 6},
    {"color": "tab:purple", "marker": "v", "linestyle": "--", "markersize": 7},
    {"color": "tab:brown", "marker": "P", "linestyle": "-.", "markersize": 7},
    {"color": "tab:pink", "marker": "X", "linestyle": ":", "markersize": 7},
    {"color": "tab:olive", "marker": "*", "linestyle": "-", "markersize": 8},
    {"color": "tab:cyan", "marker": "h", "linestyle": "--", "markersize": 7},
)


def style(policy: str, others: list[str] | None = None) -> dict[str, object]:
    """The line style of ``policy``; ``others`` lists the unknown policies in order."""
    if policy in _STYLES:
        return dict(_STYLES[policy])
    index = (others or [policy]).index(policy) if policy in (others or []) else 0
    return dict(_OTHERS[index % len(_OTHERS)])


def ordered(policies: list[str]) -> list[str]:
    """Policies in drawing order: the known ones as ``_STYLES`` has them."""
    known = [p for p in _STYLES if p in policies]
    return [p for p in policies if p not in _STYLES] + known


def readable_log_axis(axis: Any, *, symlog: bool = False) -> None:  # noqa: ANN401 (a matplotlib Axis)
    """Log ticks as plain numbers.

    1, 2 and 5 of each decade, or only decades when the axis spans more
    than three (``symlog``: linear around 0).
    """
    from matplotlib.ticker import (  # noqa: PLC0415  # optional dependency
        FuncFormatter,
        LogLocator,
        NullFormatter,
        SymmetricalLogLocator,
    )

    low, high = sorted(axis.get_view_interval())
    wide = low <= 0 or high / low > 1000
    subs = (1.0,) if wide else (1.0, 2.0, 5.0)
    if symlog:
        axis.set_major_locator(SymmetricalLogLocator(base=10, linthresh=1, subs=subs))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def scale(ax: Any, which: str, values: list[float]) -> None:  # noqa: ANN401 (a matplotlib Axes)
    """Log scale where ``values`` span more than a decade, else linear.

    With zeros among them (no limit never waits): linear up to 1 s and log
    above.
    """
    finite = [v for v in values if math.isfinite(v)]
    high = max(finite, default=0.0)
    positive = [v for v in finite if v > 0]
    axis = ax.yaxis if which == "y" else ax.xaxis
    set_scale = ax.set_yscale if which == "y" else ax.set_xscale
    if positive and len(positive) == len(finite) and high > 10 * min(positive):
        set_scale("log")
        readable_log_axis(axis)
    elif positive and len(positive) < len(finite) and high > 10:
        set_scale("symlog", linthresh=1)
        if which == "y":
            ax.set_ylim(bottom=0)
        else:
            ax.set_xlim(left=0)
        readable_log_axis(axis, symlog=True)
    unit = {"log": " (log scale)", "symlog": " (0 to 1, then log scale)"}
    label = ax.get_ylabel() if which == "y" else ax.get_xlabel()
    suffix = unit.get(axis.get_scale(), "")
    if suffix and not label.endswith(suffix):
        (ax.set_ylabel if which == "y" else ax.set_xlabel)(label + suffix)
