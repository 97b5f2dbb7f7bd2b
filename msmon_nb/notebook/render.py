"""Charts of a run's series, drawn by matplotlib (Agg) into PNG bytes.

The figure and its line artists are built once per set of charts; a redraw only moves
data into the existing artists, so its cost does not grow with the run: every series is
drawn from a ``Decimator`` (a fixed number of points, each bucket's min and max kept so a
one-step spike always shows). Non-finite values are marked with red ticks on the top
edge of their chart instead of vanishing.

Speed: a full matplotlib draw of four axes costs ~90 ms here, nearly all of it ticks and
text. Axis limits are therefore *sticky* (the x range grows geometrically, the y range
changes only when the data leave it or shrink to a small part of it), and while no limit
changes the lines are blitted onto the cached axes backgrounds: ~10 ms for four lines,
plus ~10 ms of PNG encoding. When some limits change, only those axes are redrawn: their
cell (the axes with its tick labels and title) is wiped from a blank copy of the figure
and the axes alone drawn again, so a warmup that keeps lifting the learning-rate chart
costs one axes' ticks, not five.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from msmon_nb.metrics.charts import Chart, as_lines, base_tag, plan_charts
from msmon_nb.metrics.decimate import Decimator, downsample, ema

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


@dataclass
class RenderOptions:
    """What the panel's controls set."""

    smooth: float = 0.0  # EMA weight; 0 draws raw
    scale: str = "auto"  # auto | log | linear
    width_px: int = 900
    row_px: int = 190
    dpi: int = 72
    headroom: float = 1.5  # live runs leave room to grow (fewer re-layouts); finished: 1.0


@dataclass
class _Line:
    artist: object
    smooth_artist: object
    decimator: Decimator = field(default_factory=lambda: Decimator(300))


_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def _nice_ceiling(x: float) -> float:
    """The next round number >= x (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of 10)."""
    if x <= 0:
        return 1.0
    exp = np.floor(np.log10(x))
    for m in _NICE:
        if m * 10**exp >= x * (1 - 1e-12):
            return float(m * 10**exp)
    return float(10 ** (exp + 1))


def sticky_xlim(
    current: tuple[float, float] | None,
    lo: float,
    hi: float,
    headroom: float = 1.25,
    expect: float | None = None,
) -> tuple[float, float]:
    """x limits that change only when the steps outgrow them.

    The new right edge is ``hi * headroom`` or ``expect`` (the step the run should reach
    a while from now, from its step rate), whichever is further, so a fast run does not
    force a costly re-layout every few seconds.
    """
    if current is not None and current[0] <= lo and hi <= current[1] and hi >= 0.2 * current[1]:
        return current
    right = max(hi * headroom, expect or 0.0)
    return (float(lo), max(float(lo) + 1, _nice_ceiling(right)))


def sticky_ylim(
    current: tuple[float, float] | None, lo: float, hi: float, log: bool, room: bool = False
) -> tuple[float, float]:
    """y limits kept while the data stay inside and fill at least a quarter of them.

    ``room`` (live runs): new limits leave room for the data to grow (and a positive
    series to fall to zero), and are kept while the data fill 2 % of them, so a falling
    loss, a warmup or a drifting grad_norm re-lays the axes out (the costly redraw)
    rarely; a finished run's charts are fitted tightly (``tighten``).
    """
    f = np.log10 if log else (lambda v: v)
    if current is not None and current[0] <= lo and hi <= current[1]:
        span = f(current[1]) - f(current[0])
        if span > 0 and (f(hi) - f(lo)) >= (0.02 if room else 0.25) * span:
            return current
    if log:
        factor = 3.0 if room else 1.5
        return (lo / factor, hi * factor) if hi > lo else (lo / 2, hi * 2)
    if not room:
        pad = (hi - lo) * 0.1 if hi > lo else max(abs(hi) * 0.1, 1e-12)
        return (lo - pad, hi + pad)
    # live: room to double (a warmup, a rising throughput) and, for a positive series
    # such as a falling loss, down to zero
    span = max(hi - lo, abs(hi) * 0.5, abs(lo) * 0.5, 1e-12)
    return (0.0 if lo >= 0 else lo - span, hi + span if hi > 0 else hi + 0.1 * span)


def _label(key: str, lines: int, tags: int) -> str | None:
    """Legend text of a key as the plan labels it (``Chart.label``: an optimizer's series
    by its name): none for a lone line; rank names within one tag; the whole label
    otherwise."""
    if lines < 2:
        return None
    base, _, suffix = key.partition("@")
    if suffix in ("min", "max"):
        return None if suffix == "max" else (f"{base} min..max" if tags > 1 else "min..max")
    if tags > 1 or not suffix:
        return key
    return suffix


def _apply_limits(ax, xlim: tuple, ylim: tuple | None, log: bool) -> None:
    """Scale, locators and limits of one axes."""
    ax.set_yscale("log" if log else "linear")
    if log:  # 1-2-5 labels, so a range inside one decade still gets numbers
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(4))
    ax.yaxis.set_minor_formatter(NullFormatter())  # set_yscale resets it
    ax.set_xlim(*xlim)
    if ylim is not None:
        ax.set_ylim(*ylim)


def _cells(
    boxes: list[tuple[float, float, float, float]], width: float, height: float
) -> list[tuple[float, float, float, float]]:
    """Each axes' cell in a two-column grid: its box, tick labels and title, no more.

    Columns split just right of the left axes (whose right side holds only ticks; the
    right column's y labels need the gap); rows split halfway between one row's x tick
    labels and the title of the row below. ``boxes`` are display pixels (origin bottom
    left); the cells are buffer pixels (origin top left), as ``restore_region`` takes them.
    """
    out = []
    for i, (_x0, y0, x1, y1) in enumerate(boxes):
        col = i % 2
        left = 0.0 if col == 0 else boxes[i - 1][2] + 6
        right = width if col == 1 or i + 1 >= len(boxes) else x1 + 6
        top = height if i < 2 else (boxes[i - 2][1] + y1) / 2
        bottom = 0.0 if i + 2 >= len(boxes) else (y0 + boxes[i + 2][3]) / 2
        # as Agg's buffer counts rows: from the top
        out.append((left, height - top, right, height - bottom))
    return out


def _skip_label_layout(ax) -> None:
    """Skip matplotlib's per-draw axis-label placement: our axes have no axis labels.

    ``Axis._update_label_position`` measures every tick label of every axis on each draw
    (a quarter of a full redraw here) only to place the x/y labels we never set.
    """
    for axis in (ax.xaxis, ax.yaxis):
        if hasattr(axis, "_update_label_position"):
            axis._update_label_position = lambda renderer: None


class ChartRenderer:
    """Keeps one matplotlib figure and redraws it from series (see module docstring)."""

    MAX_TAIL = 200  # points drawn for the not-yet-bucketed tail of a series

    def __init__(self, options: RenderOptions | None = None) -> None:
        self.options = options or RenderOptions()
        self.charts: list[Chart] = []
        self._lines: dict[str, _Line] = {}
        self._figure = None
        self._axes: list = []
        self._nan_artists: list = []
        self._limits: list[tuple] = []
        self._backgrounds: list = []
        self._blank = None  # the figure without axes, to wipe one axes' cell
        self._cells: list[tuple[float, float, float, float]] = []
        self.full_draws = 0  # re-layouts (all axes, or only those whose limits changed)
        self.axis_cost = 0.03  # seconds to re-lay out one axes (measured at each re-layout)
        self.refused_cost = 0.0  # what the last refused re-layout would have cost
        self.fast_draws = 0

    def _build(self, charts: list[Chart]) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        opts = self.options
        rows = (len(charts) + 1) // 2
        fig = Figure(
            figsize=(opts.width_px / opts.dpi, rows * opts.row_px / opts.dpi), dpi=opts.dpi
        )
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, 2, squeeze=False).reshape(-1)
        self._lines = {}
        self._nan_artists = []
        for ax, chart in zip(axes, charts, strict=False):
            # a plain text artist: set_title re-measures every tick label on each draw
            ax.text(0.0, 1.02, chart.title, transform=ax.transAxes, fontsize=10)
            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.yaxis.set_major_locator(MaxNLocator(4))
            _skip_label_layout(ax)
            ax.tick_params(labelsize=8)
            ax.ticklabel_format(axis="x", style="plain", useOffset=False)
            ax.yaxis.set_minor_formatter(NullFormatter())  # log axes: no crowded minor labels
            ax.grid(True, alpha=0.3)
            bases = {base_tag(t) for t in chart.tags}
            color_index = 0
            for tag in chart.tags:
                band = tag.endswith(("@min", "@max"))  # the across-ranks envelope
                if band:
                    color = "#9e9e9e"
                else:
                    color = COLORS[color_index % len(COLORS)]
                    color_index += 1
                label = _label(chart.label(tag), len(chart.tags), len(bases))
                (raw,) = ax.plot(
                    [],
                    [],
                    color=color,
                    lw=0.8 if band else 1.0,
                    ls="--" if band else "-",
                    label=label,
                    animated=True,
                )
                (smooth,) = ax.plot([], [], color=color, lw=1.8, alpha=0.0, animated=True)
                self._lines[tag] = _Line(raw, smooth)
            if len(chart.tags) > 1:
                ax.legend(fontsize=7, loc="upper right")
            nan = ax.plot(
                [],
                [],
                "x",
                color="#d62728",
                ms=6,
                transform=ax.get_xaxis_transform(),
                animated=True,
            )[0]
            self._nan_artists.append(nan)
        for ax in axes[len(charts) :]:
            ax.set_visible(False)
        # fixed margins (tight_layout would re-measure every label on each layout change)
        height = rows * opts.row_px
        fig.subplots_adjust(
            left=62 / opts.width_px,
            right=1 - 12 / opts.width_px,
            bottom=22 / height,
            top=1 - 20 / height,
            wspace=0.2,
            hspace=28 / opts.row_px * 1.6,
        )
        self._figure = fig
        self._axes = list(axes[: len(charts)])
        self._limits = [None] * len(charts)
        self._backgrounds = []
        self.charts = charts
        for ax in self._axes:
            ax.set_visible(False)
        fig.canvas.draw()
        self._blank = fig.canvas.copy_from_bbox(fig.bbox)
        for ax in self._axes:
            ax.set_visible(True)
        self._cells = _cells(
            [ax.bbox.extents for ax in self._axes], fig.bbox.width, fig.bbox.height
        )

    def render(
        self,
        series: Mapping[str, object],
        expect_step: float | None = None,
        layout_budget: float = math.inf,
    ) -> bytes | None:
        """PNG of the charts for ``series`` (tag -> object with ``steps``/``values``).

        ``expect_step``: the step a live run is expected to reach soon (see sticky_xlim).
        ``layout_budget``: seconds re-layouts may take now (priced at the last re-layout's
        cost per axes). Axes whose limits must change beyond that keep their last
        picture (``deferred``; clipping new data to old axes would hide what matters)
        while the others are updated. None when even the figure cannot be drawn.
        """
        # a heatmap is drawn in the browser; a picture shows its first statistic as lines
        charts = [as_lines(c) for c in plan_charts(list(series))]
        if [c.tags for c in charts] != [c.tags for c in self.charts] or self._figure is None:
            if self._figure is not None and self._too_dear(len(charts), layout_budget):
                return None
            self._build(charts)
        opts = self.options
        artists: list[list] = []
        new_limits = []
        for chart, nan_artist, old in zip(
            self.charts, self._nan_artists, self._limits, strict=True
        ):
            log = opts.scale == "log" or (opts.scale == "auto" and chart.log)
            drawn, nan_steps, xs_all, ys_all = [], [], [], []
            for tag in chart.tags:
                s = series.get(tag)
                line = self._lines[tag]
                if s is None or not len(s.steps):
                    continue
                xs, ys, mx, sm = self._line_data(line, s.steps, s.values, log)
                line.artist.set_data(xs, ys)
                line.artist.set_alpha(0.3 if opts.smooth > 0 else 1.0)
                drawn.append(line.artist)
                if opts.smooth > 0:
                    line.smooth_artist.set_data(mx, sm)
                    line.smooth_artist.set_alpha(1.0)
                    drawn.append(line.smooth_artist)
                nan_steps.extend(line.decimator.nonfinite_steps)
                xs_all.append(np.asarray(s.steps[[0, -1]], dtype=np.float64))
                if len(ys):
                    ys_all.append(np.array([ys.min(), ys.max()]))
            nan_artist.set_data(nan_steps, [0.97] * len(nan_steps))
            drawn.append(nan_artist)
            artists.append(drawn)
            if not xs_all:
                new_limits.append(old)
                continue
            xr = np.concatenate(xs_all)
            xlim = sticky_xlim(
                old[0] if old else None,
                float(xr.min()),
                float(xr.max()),
                opts.headroom,
                expect_step if opts.headroom > 1 else None,
            )
            ylim = old[1] if old else None
            if ys_all:
                yr = np.concatenate(ys_all)
                ylim = sticky_ylim(
                    ylim if old and old[2] == log else None,
                    yr.min(),
                    yr.max(),
                    log,
                    room=opts.headroom > 1,
                )
            new_limits.append((xlim, ylim, log))
        canvas = self._figure.canvas
        if not self._backgrounds:  # first draw of this figure: every axes
            if self._too_dear(len(self._axes), layout_budget):
                return None
            began = time.perf_counter()
            for ax, limits in zip(self._axes, new_limits, strict=True):
                if limits is not None:
                    _apply_limits(ax, *limits)
            canvas.draw()  # animated artists are left out of this pass
            self._backgrounds = [canvas.copy_from_bbox(ax.bbox) for ax in self._axes]
            self._limits = new_limits
            self._note_layout(began, len(self._axes))
            deferred: set[int] = set()
        else:
            deferred = self._relayout(new_limits, layout_budget)
        for i, (ax, drawn) in enumerate(zip(self._axes, artists, strict=True)):
            if i in deferred:
                continue  # its pixels stay as last drawn until a re-layout is affordable
            for artist in drawn:
                ax.draw_artist(artist)
        return self._png()

    def _relayout(self, new_limits: list, budget: float) -> set[int]:
        """Restore every axes' background, re-laying out those whose limits moved, as
        many as ``budget`` seconds pay for (in chart order); the indexes left for later.

        A re-laid axes' cell is wiped from the blank figure and the axes drawn alone.
        """
        canvas = self._figure.canvas
        changed = [
            i for i, (a, b) in enumerate(zip(self._limits, new_limits, strict=True)) if a != b
        ]
        affordable = int(budget // self.axis_cost) if math.isfinite(budget) else len(changed)
        now, later = changed[:affordable], set(changed[affordable:])
        self.refused_cost = self.axis_cost * len(later)
        began = time.perf_counter()
        renderer = canvas.get_renderer()
        for i, ax in enumerate(self._axes):
            if i in later:
                continue
            if i in now:
                _apply_limits(ax, *new_limits[i])
                canvas.restore_region(self._blank, bbox=self._cells[i], xy=(0, 0))
                ax.draw(renderer)  # animated artists are left out, drawn after
                self._backgrounds[i] = canvas.copy_from_bbox(ax.bbox)
                self._limits[i] = new_limits[i]
            else:
                canvas.restore_region(self._backgrounds[i])
        if now:
            self._note_layout(began, len(now))
        else:
            self.fast_draws += 1
        return later

    def _note_layout(self, began: float, axes: int) -> None:
        self.full_draws += 1
        self.axis_cost = (time.perf_counter() - began) / max(1, axes)

    def _too_dear(self, axes: int, budget: float) -> bool:
        """True (and ``refused_cost`` set) when laying out ``axes`` exceeds ``budget``."""
        cost = self.axis_cost * axes
        self.refused_cost = cost if cost > budget else 0.0
        return cost > budget

    @property
    def deferred(self) -> bool:
        """True when some axes wait for a re-layout (their charts show older data)."""
        return self.refused_cost > 0

    def _line_data(self, line: _Line, steps, values, log: bool):
        line.decimator.update(steps, values)
        xs, ys = line.decimator.points(steps, values)
        if len(xs) > 2 * self.MAX_TAIL:
            head = 2 * len(line.decimator)
            tx, ty, _, _ = downsample(xs[head:], ys[head:], self.MAX_TAIL)
            xs = np.concatenate([xs[:head], tx])
            ys = np.concatenate([ys[:head], ty])
        mx = sm = None
        if self.options.smooth > 0:
            mx, my = line.decimator.means(steps, values)
            sm = ema(my, self.options.smooth)
        if log:
            keep = ys > 0
            xs, ys = xs[keep], ys[keep]
            if sm is not None:
                ok = sm > 0
                mx, sm = mx[ok], sm[ok]
        return xs, ys, mx, sm

    def tighten(self) -> None:
        """Drop the live headroom: the next render fits the axes to the data."""
        self.options.headroom = 1.0
        self._limits = [None] * len(self._limits)

    def first_nonfinite(self) -> dict[str, int]:
        """tag -> first step whose value was NaN or Inf, among the charted tags."""
        return {
            tag: line.decimator.nonfinite_steps[0]
            for tag, line in self._lines.items()
            if line.decimator.nonfinite_steps
        }

    def _png(self) -> bytes:
        from PIL import Image

        canvas = self._figure.canvas
        width, height = canvas.get_width_height()
        image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        out = io.BytesIO()
        image.convert("RGB").save(out, format="PNG", compress_level=1)
        return out.getvalue()
