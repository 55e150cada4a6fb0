"""Geometry of the failover chart: one bar per succeeded promotion, the failover figure.

Each bar is what clients waited: from the outage's start to the routing commit (the figure of
fleets/core/outage.py), stacked by part: detection, then each step up to the switch. The steps
that follow the switch act on the old active after clients were served again (a best-effort
sleep of a dead host can take its whole `sleepTimeoutMs`): they are shown apart, as a `+N s`
under the bar's time and in its tooltip, never as bar height, so a 2 s failover never reads as
19 s. The figure itself is written above the bar.

Computed on the server and drawn as inline SVG by the template: no charting library, no
JavaScript, nothing fetched from outside (the portal runs in closed networks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from fleets.core.states import FAILOVER_PATH, PROMOTE_STEPS, Step

# "detection" runs from the outage's start (the first moment a client could not be served:
# `Operation.detected_at`) to the start of the promotion (real failovers only); it comes first
# because it comes first in the incident. The bar stops at the routing commit.
SERIES = ("detection", *FAILOVER_PATH)
# The steps after the switch, on the old active: shown apart from the bar.
AFTER_SWITCH: tuple[Step, ...] = PROMOTE_STEPS[len(FAILOVER_PATH) :]

WIDTH, HEIGHT = 760, 230
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 52, 12, 14, 40


@dataclass
class FailoverSample:
    operation_id: str
    finished_at: datetime
    reason: str
    target: str
    durations_ms: dict[str, int]  # series or step name -> milliseconds
    # A real failover's figure (outage start to routing commit); None for a planned promotion,
    # whose bar is its steps up to the switch.
    failover_ms: int | None = None
    outcomes: dict[str, str] = field(default_factory=dict)  # step -> outcome, when not done

    @property
    def to_routing_ms(self) -> int:
        """The bar: the failover figure, or the parts up to the routing commit without one."""
        if self.failover_ms is not None:
            return self.failover_ms
        return sum(self.durations_ms.get(name, 0) for name in SERIES)

    @property
    def after_switch_ms(self) -> int:
        """The steps after the routing commit, on the old active (not part of the figure)."""
        return sum(self.durations_ms.get(name, 0) for name in AFTER_SWITCH)


@dataclass
class Rect:
    series: str
    x: float
    y: float
    w: float
    h: float
    title: str


@dataclass
class Bar:
    x: float
    w: float
    label: str
    title: str
    rects: list[Rect] = field(default_factory=list)
    routing_y: float | None = None
    figure: str = ""  # the bar's figure, above it
    after: str = ""  # the steps after the switch, apart from the bar ("" when none ran)
    after_title: str = ""
    top_y: float = 0.0

    @property
    def figure_y(self) -> float:
        return round(max(self.top_y - 4, PAD_TOP - 4), 2)

    @property
    def x2(self) -> float:
        return round(self.x + self.w, 2)


@dataclass
class Tick:
    y: float
    label: str


@dataclass
class Chart:
    width: int
    height: int
    bars: list[Bar]
    ticks: list[Tick]
    series: tuple[str, ...]
    plot_left: int
    plot_right: int
    plot_bottom: int
    empty: bool

    @property
    def tick_label_x(self) -> int:
        return self.plot_left - 6

    @property
    def bar_label_y(self) -> int:
        return self.plot_bottom + 14

    @property
    def after_label_y(self) -> int:
        return self.plot_bottom + 28


def fmt_ms(ms: float | None) -> str:
    """Render a duration the way an operator reads it: 840 ms, 3.2 s, 2 m 05 s."""
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} m {rest:02d} s"


# Tick spacings an operator reads at a glance, in milliseconds: round numbers of the unit the
# axis is in (ms, s, minutes, hours), so every tick lands on a whole label ("1m30s", never
# "1m 07s"), whatever the longest bar.
_TICK_STEPS_MS = (
    *(1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500),
    *(s * 1000 for s in (1, 2, 2.5, 5, 10, 15, 20, 30)),
    *(m * 60_000 for m in (1, 2, 5, 10, 15, 20, 30)),
    *(h * 3_600_000 for h in (1, 2, 3, 6, 12, 24, 48, 96, 168)),
)
# The axis font (dashboard.css `.chart .axis-label`: 10.5px monospace) is about 0.6 em wide per
# character: a label must fit between the viewBox's left edge and the tick's label anchor, or
# the browser clips its first characters (a "1 m 00 s" read as ". m 00 s").
AXIS_CHAR_W = 10.5 * 0.6


def _nice_step(span: float) -> float:
    """Return a round tick spacing giving at most about four ticks over `span` milliseconds."""
    raw = max(span / 4, 1)
    for step in _TICK_STEPS_MS:
        if raw <= step:
            return float(step)
    # Beyond a week per tick: whole weeks.
    week = _TICK_STEPS_MS[-1]
    return float(week * -(-raw // week))


def axis_label(ms: float) -> str:
    """Render a tick value short enough for the axis: 0, 250 ms, 2.5 s, 45 s, 1m30s, 2h, 1h30m.

    Shorter than `fmt_ms` on purpose: the axis has a few characters' room, and tick values are
    round (`_nice_step`), so nothing is lost."""
    if ms <= 0:
        return "0"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    seconds = int(round(ms / 1000))
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest:02d}s"
    hours, rest = divmod(seconds, 3600)
    if hours < 48:
        return f"{hours}h" if rest < 60 else f"{hours}h{rest // 60:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d" if hours == 0 else f"{days}d{hours}h"


def build_chart(samples: list[FailoverSample]) -> Chart:
    """Lay out stacked bars for `samples` (oldest first) in a fixed-size SVG viewBox."""
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    bottom = HEIGHT - PAD_BOTTOM
    if not samples:
        return Chart(WIDTH, HEIGHT, [], [], SERIES, PAD_LEFT, WIDTH - PAD_RIGHT, bottom, empty=True)
    peak = max(max(s.to_routing_ms for s in samples), 1)
    step = _nice_step(peak)
    top_value = step * (int(peak // step) + 1)
    scale = plot_h / top_value
    ticks = [
        Tick(bottom - i * step * scale, axis_label(i * step))
        for i in range(int(round(top_value / step)) + 1)
    ]

    # Dates only when the samples span days; within a day the time alone tells them apart.
    span = samples[-1].finished_at - samples[0].finished_at
    label_format = "%m-%d %H:%M" if span.total_seconds() >= 86400 else "%H:%M:%S"
    slot_w = plot_w / max(len(samples), 1)
    bar_w = min(48.0, slot_w * 0.7)
    bars = []
    for i, sample in enumerate(samples):
        x = PAD_LEFT + i * slot_w + (slot_w - bar_w) / 2
        label = sample.finished_at.strftime(label_format)
        what = "failover" if sample.failover_ms is not None else "to routing"
        after = _after_switch(sample)
        bar = Bar(
            x=round(x, 2),
            w=round(bar_w, 2),
            label=label,
            title=(
                f"{sample.reason} promotion to {sample.target}, finished "
                f"{sample.finished_at:%Y-%m-%d %H:%M:%S} UTC: {what} "
                f"{fmt_ms(sample.to_routing_ms)}"
                + (f"; after the switch, on the old active: {after}" if after else "")
            ),
            figure=fmt_ms(sample.to_routing_ms),
            after=f"+{fmt_ms(sample.after_switch_ms)}" if after else "",
            after_title=f"after the switch, on the old active: {after}" if after else "",
        )
        y = float(bottom)
        for name in SERIES:
            ms = sample.durations_ms.get(name)
            if not ms:
                if name == Step.SWITCH_ROUTE:
                    bar.routing_y = round(y, 2)
                continue
            h = ms * scale
            y -= h
            title = f"{name}: {fmt_ms(ms)}"
            bar.rects.append(Rect(name, bar.x, round(y, 2), bar.w, round(max(h, 0.5), 2), title))
            if name == Step.SWITCH_ROUTE:
                bar.routing_y = round(y, 2)
        bar.top_y = round(y, 2)
        bars.append(bar)
    return Chart(
        WIDTH, HEIGHT, bars, ticks, SERIES, PAD_LEFT, WIDTH - PAD_RIGHT, bottom, empty=False
    )


def _after_switch(sample: FailoverSample) -> str:
    """The steps after the switch with their times and outcomes ("" when none was recorded)."""
    parts = []
    for name in AFTER_SWITCH:
        ms = sample.durations_ms.get(name)
        if ms is None:
            continue
        outcome = sample.outcomes.get(name, "").replace("_", " ")
        parts.append(f"{name} {fmt_ms(ms)}" + (f" ({outcome})" if outcome else ""))
    return ", ".join(parts)
