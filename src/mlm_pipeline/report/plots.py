"""The report's plots, drawn with matplotlib (the ``report`` extra) from :func:`.data.report_data`.

Each plot is a :class:`Plot`: a file-safe name, a title, a caption and the PNG bytes. The HTML page
embeds the PNGs; ``report --png DIR`` writes them as files. A plot whose data the run did not
record is not drawn (its reason is in ``not_known``). Figures are made with ``matplotlib.figure``
directly (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from typing import Callable

from mlm_pipeline.errors import ConfigError

DPI = 100
WIDTH, HEIGHT = 7.5, 3.4
COLOR, ACCENT = "#3b6ea8", "#d9822b"
MANY_TASKS = 400
"""Above this many tasks, throughput is a histogram and the timeline a scatter (not a bar each)."""
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "WenQuanYi Zen Hei",
             "WenQuanYi Micro Hei", "Droid Sans Fallback", "AR PL UMing CN")
"""Fonts for tokens of Chinese, Japanese and Korean text, used when installed (after DejaVu Sans)."""


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    caption: str
    png: bytes


def _figure(rows: int = 1, cols: int = 1, height: float = HEIGHT):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plots need matplotlib: install mlm-pipeline with the 'report' extra "
                          "(pip install '.[report]' from a clone, or 'WHEEL[report]')") from None
    fig = Figure(figsize=(WIDTH, height), dpi=DPI, layout="constrained")
    return fig, fig.subplots(rows, cols)


def _png(fig, title: str) -> bytes:
    fig.suptitle(title, fontsize=11, fontweight="bold")  # (the PNG files stand alone)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


@functools.lru_cache(maxsize=1)
def _fonts() -> tuple[list[str], list]:
    """The font families for token labels (DejaVu Sans, then any installed CJK font) and their faces."""
    from matplotlib import font_manager, ft2font

    installed = {f.name for f in font_manager.fontManager.ttflist}
    families = ["DejaVu Sans", *(name for name in CJK_FONTS if name in installed)]
    faces = [ft2font.FT2Font(font_manager.findfont(name, fallback_to_default=False)) for name in families]
    return families, faces


def token_label(token: str) -> str:
    """A token as a plot label: characters no installed font has are written as U+XXXX (never a
    blank box), and ``$`` is escaped (matplotlib would read math between two)."""
    _, faces = _fonts()
    return "".join("\\$" if c == "$" else c if any(face.get_char_index(ord(c)) for face in faces)
                   else f"U+{ord(c):04X}" for c in token)


def _fmt(x: float | None, spec: str = ".1%") -> str:
    return "n/a" if x is None else format(x, spec)


def _instance_length(data: dict) -> Plot | None:
    lengths = data["lengths"]
    hist = lengths["instance_length_histogram"]
    if not hist:
        return None
    fig, ax = _figure()
    ax.bar(list(hist), list(hist.values()), width=1.0, color=COLOR)
    if lengths.get("max_seq_length"):
        ax.axvline(lengths["max_seq_length"], color=ACCENT, linestyle="--", label="max_seq_length")
        ax.legend(loc="upper left")
    ax.set(xlabel="tokens in the instance ([CLS] and [SEP] included)", ylabel="instances")
    caption = (f"mean {_fmt(lengths.get('mean_length'), ',.1f')} tokens; at max_seq_length "
               f"{_fmt(lengths.get('full_length_share'))} of instances")
    return Plot("instance_length", "Instance length", caption, _png(fig, "Instance length"))


def _tokens_per_instance(data: dict) -> Plot | None:
    lengths = data["lengths"]
    hist = lengths["instance_length_histogram"]
    if not hist:
        return None
    count = sum(hist.values())
    xs, ys, running = [min(hist) - 1], [0.0], 0  # from 0: a run of one length still shows its step
    for k, v in hist.items():
        running += v
        xs.append(k)
        ys.append(running / count)
    fig, ax = _figure()
    ax.step(xs, ys, where="post", color=COLOR)
    ax.set(xlabel="tokens per instance", ylabel="share of instances with at most x", ylim=(0, 1.02))
    if lengths.get("mean_length"):
        ax.axvline(lengths["mean_length"], color=ACCENT, linestyle=":", label=f"mean {lengths['mean_length']:.1f}")
        ax.legend(loc="upper left")
    caption = (f"cumulative; padding in fixed-length rows: {_fmt(lengths.get('padding_share'))} of "
               f"{lengths.get('max_seq_length')} positions")
    return Plot("tokens_per_instance", "Tokens per instance", caption, _png(fig, "Tokens per instance"))


def draw_masked_per_instance(ax, hist: dict) -> None:
    """Instances by their count of masked positions: whole numbers on the axis (a run of few
    counts got ticks at 19.5, 20.5)."""
    from matplotlib.ticker import MaxNLocator

    ax.bar(list(hist), list(hist.values()), width=0.8, color=COLOR)
    ax.set(xlabel="masked positions in the instance", ylabel="instances")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # (one count: its tick alone)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _masked_per_instance(data: dict) -> Plot | None:
    masking = data["masking"]
    hist = masking.get("masked_per_instance_histogram")
    if not hist:
        return None
    fig, ax = _figure()
    draw_masked_per_instance(ax, hist)
    caption = (f"mean {_fmt(masking.get('masked_per_instance_mean'), '.2f')} per instance; replaced by [MASK] "
               f"{_fmt(masking.get('as_mask_token'))}, random {_fmt(masking.get('as_random_token'))}, "
               f"kept {_fmt(masking.get('kept'))}")
    return Plot("masked_per_instance", "Masked positions per instance", caption, _png(fig, "Masked positions per instance"))


def _random_next(data: dict) -> Plot | None:
    pairs = data["pairs"]
    if "random_next" not in pairs:
        return None
    fig, ax = _figure(height=1.9)
    labels = ["actual next (label 0)", "random next (label 1)"]
    values = [pairs["actual_next"], pairs["random_next"]]
    ax.barh(labels, values, color=[COLOR, ACCENT])
    for y, v in enumerate(values):
        ax.annotate(f"{v:,}", (v, y), xytext=(3, 0), textcoords="offset points", va="center")
    ax.set(xlabel="instances")
    ax.margins(x=0.15)
    caption = f"random-next share {_fmt(pairs.get('random_next_share'))} (Google's algorithm draws about 50%)"
    return Plot("random_next", "Random-next share", caption, _png(fig, "Random-next share"))


def draw_timeline(ax, timed: list[dict]) -> None:
    """A bar per task from its start to its end, a row each in plan order: the rows span the
    axis (one task ran from -0.4 to 0.4 on it), labelled by task id when few."""
    for y, t in enumerate(timed):
        ax.broken_barh([(t["start_offset"], t["seconds"])], (y - 0.4, 0.8), color=COLOR)
    ax.set(xlabel="seconds since the first task started", ylabel="task (plan order)", title="when each task ran")
    ax.set_ylim(-0.5, len(timed) - 0.5)
    if len(timed) <= 12:
        ax.set_yticks(range(len(timed)), [t["task_id"] for t in timed], fontsize=7)
    else:
        ax.yaxis.get_major_locator().set_params(integer=True)


def _task_throughput(data: dict) -> Plot | None:
    tasks = data["tasks"]
    if not tasks:
        return None
    fig, (left, right) = _figure(1, 2, height=HEIGHT)
    names = [t["task_id"] for t in tasks]
    speeds = [t["mb_per_s"] or 0 for t in tasks]
    timed = [t for t in tasks if t.get("start_offset") is not None]
    if len(tasks) > MANY_TASKS:  # a bar or a box per task would be unreadable (and slow to draw)
        left.hist(speeds, bins=50, color=COLOR)
        left.set(xlabel="MB of input per second", ylabel="tasks", title="throughput")
        right.scatter([t["start_offset"] for t in timed], [t["seconds"] for t in timed], s=4, color=COLOR)
        right.set(xlabel="seconds since the first task started", ylabel="seconds the task took",
                  title="when each task ran")
    else:
        left.bar(range(len(tasks)), speeds, color=COLOR)
        left.set(xlabel="task (plan order)", ylabel="MB of input per second", title="throughput")
        draw_timeline(right, timed)
        if len(names) <= 12:
            left.set_xticks(range(len(tasks)), names, rotation=90, fontsize=7)
    seconds = [t["seconds"] for t in tasks]
    mbs = sum(t["bytes_read"] for t in tasks) / 1e6
    caption = (f"{len(tasks)} tasks, {sum(seconds):,.1f} task-seconds in all ({mbs / max(sum(seconds), 1e-9):,.2f} "
               f"MB/s per task on average), slowest {max(seconds):,.1f} s")
    return Plot("task_throughput", "Per-task throughput and time", caption, _png(fig, "Per-task throughput and time"))


def _skips(data: dict) -> Plot | None:
    skips = data["skips"]
    rows = [(f"document: {k}", v) for k, v in skips["documents"].items()] + \
           [(f"file: {k}", v) for k, v in skips["files"].items()]
    if not rows:
        return None
    fig, ax = _figure(height=max(1.6, 0.4 * len(rows) + 0.9))
    ax.barh([r for r, _ in rows], [v for _, v in rows], color=ACCENT)
    ax.invert_yaxis()
    ax.set(xlabel="count")
    ax.xaxis.get_major_locator().set_params(integer=True)
    caption = f"{sum(skips['documents'].values()):,} documents and {sum(skips['files'].values()):,} files skipped"
    return Plot("skips", "Skips by reason", caption, _png(fig, "Skips by reason"))


UNKNOWN_TOKENS = ("[UNK]", "<unk>")


def unk_line(tokens: dict) -> str:
    """The [UNK] rate in words, as the figure, its caption and the page's table say it."""
    if "unk_rate" not in tokens:
        return "[UNK] rate not recorded"
    return (f"[UNK] rate {_fmt(tokens.get('unk_rate'), '.3%')} ({tokens.get('unk_tokens', 0):,} of "
            f"{tokens.get('tokens', 0):,} tokens)")


def draw_top_tokens(ax, tokens: dict) -> str:
    """The most frequent tokens, the unknown token's bar in the accent colour, and the [UNK]
    rate in the figure itself (a PNG of ``--png`` has no caption); returns that rate's line."""
    top = tokens["top_tokens"]
    colors = [ACCENT if t["token"] in UNKNOWN_TOKENS else COLOR for t in top]
    ax.barh(range(len(top)), [t["count"] for t in top], color=colors)
    ax.set_yticks(range(len(top)), [token_label(t["token"]) for t in top], fontsize=8, fontfamily=_fonts()[0])
    ax.invert_yaxis()
    ax.set(xlabel="occurrences in the input")
    unk = unk_line(tokens)
    ax.set_title(unk, fontsize=9, color=ACCENT if "unk_rate" in tokens else None)
    return unk


def _top_tokens(data: dict) -> Plot | None:
    tokens = data["tokens"]
    top = tokens.get("top_tokens")
    if not top:
        return None
    fig, ax = _figure(height=0.22 * len(top) + 1.3)
    unk = draw_top_tokens(ax, tokens)
    return Plot("top_tokens", "Top tokens and [UNK] rate", f"{unk}; {tokens.get('top_tokens_note', '')}", _png(fig, "Top tokens and [UNK] rate"))


PLOTS: tuple[Callable[[dict], Plot | None], ...] = (
    _instance_length, _tokens_per_instance, _masked_per_instance, _random_next, _task_throughput, _skips, _top_tokens,
)


def make_plots(data: dict) -> list[Plot]:
    """Every plot the report's data allows, in page order."""
    return [p for p in (make(data) for make in PLOTS) if p is not None]


__all__ = ["PLOTS", "Plot", "draw_masked_per_instance", "draw_timeline", "draw_top_tokens", "make_plots",
           "token_label", "unk_line"]
