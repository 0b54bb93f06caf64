"""``mlm-pipeline report OUT --html report.html`` (and ``--png DIR``): one self-contained page.

The page needs no network and no script: the plots (:mod:`.plots`, matplotlib) are PNGs embedded
as ``data:`` URIs, the styles are inline. What the run did not record is said in words where its
plot would be.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from mlm_pipeline.report.plots import Plot, make_plots

SECTIONS = (  # plot name, title, the not_known key that explains a missing plot, what no plot means otherwise
    ("instance_length", "Instance length", None, "no instances"),
    ("tokens_per_instance", "Tokens per instance", None, "no instances"),
    ("masked_per_instance", "Masked positions per instance", "masked_per_instance", "no masked positions"),
    ("random_next", "Random-next share", "random_next_share", "no pairs"),
    ("task_throughput", "Per-task throughput and time", "task_throughput", "no tasks"),
    ("skips", "Skips by reason", None, "nothing was skipped"),
    ("top_tokens", "Top tokens and [UNK] rate", "top_tokens", "no tokens"),
)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { padding: 0.15em 0.8em 0.15em 0; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.5em 0; } figure img { max-width: 100%; }
figcaption, .note { color: #555; font-size: 0.9em; }
.unknown { color: #8a5a00; }
.warning { color: #a40000; font-weight: 600; }
code { font-size: 0.95em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _num(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return _e("n/a" if value is None else value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return _e(value)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _table(rows: list[tuple[str, str]], cls: str = "") -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td class='{cls}'>{v}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


_PAIR_ROWS = (  # what the text report prints of NSP pairs and ELECTRA examples, where the run counted it
    ("short_target_documents", "documents with a short target length"), ("truncated_pairs", "truncated pairs"),
    ("chunks_without_pair", "chunks without a pair"), ("single_segment", "one-segment examples"),
    ("one_segment_draws", "examples drawn as one segment"), ("random_target", "random target lengths"),
    ("truncated_examples", "truncated examples"), ("dropped_tokens", "tokens dropped by truncation"),
)


def _summary(data: dict) -> str:
    run, inp, out, tok = data["run"], data["input"], data["output"], data["tokens"]
    pairs, masking = data["pairs"], data["masking"]
    rows = [
        ("objective / masking / format", _e(f"{run['objective']} / {run['masking']} / {run['format']}"
                                            + (" (reference mode)" if run.get("reference_mode") else ""))),
        ("input files", _num(inp["files"])), ("bytes read", _num(inp["bytes_read"])),
        ("documents read", _num(inp["documents_read"])), ("sentences", _num(inp["sentences"])),
        ("tokens", _num(tok["tokens"])),
        ("instances", _num(out["instances"])), ("shards", _num(out["shards"])),
        ("bytes written", _num(out["bytes_written"])),
    ]
    if "random_next_share" in pairs:
        rows.append(("random-next share", _share(pairs["random_next_share"])))
    rows += [(label, _num(pairs[key])) for key, label in _PAIR_ROWS if key in pairs]
    if masking:
        rows.append(("masked tokens", _num(masking["masked_tokens"])))
    if "unk_rate" in tok:
        rows.append(("[UNK] rate", "n/a" if tok["unk_rate"] is None else f"{tok['unk_rate']:.3%}"))
    return _table(rows, "n")


def _warnings(data: dict) -> str:
    if not data.get("warnings"):
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in data["warnings"])
    return f"<section id='warnings'><h2>Warnings</h2><ul class='warning'>{items}</ul></section>"


def _not_known(data: dict) -> str:
    if not data["not_known"]:
        return "<p class='note'>Every statistic of this objective was recorded.</p>"
    items = "".join(f"<li><code>{_e(k)}</code>: {_e(v)}</li>" for k, v in sorted(data["not_known"].items()))
    return f"<ul class='unknown'>{items}</ul>"


def _section(name: str, title: str, why_key: str | None, none_text: str, plots: dict[str, Plot], data: dict) -> str:
    plot = plots.get(name)
    if plot is None:
        why = data["not_known"].get(why_key) if why_key else None
        text = f"<p class='unknown'>Not known: {_e(why)}.</p>" if why else f"<p class='note'>{_e(none_text)}.</p>"
        return f"<section id='{name}'><h2>{_e(title)}</h2>{text}</section>"
    src = "data:image/png;base64," + base64.b64encode(plot.png).decode("ascii")
    extra = _token_table(data) if name == "top_tokens" else ""
    return (f"<section id='{name}'><h2>{_e(title)}</h2><figure><img class='plot' alt='{_e(title)}' src='{src}'>"
            f"<figcaption>{_e(plot.caption)}</figcaption></figure>{extra}</section>")


def _token_table(data: dict) -> str:
    """The top tokens as text too (the browser's fonts show every script; the plot's may not)."""
    tokens = data["tokens"]
    rows = "".join(f"<tr><td><code>{_e(t['token'])}</code></td><td class='n'>{t['count']:,}</td>"
                   f"<td class='n'>{_share(t['share'])}</td></tr>" for t in tokens["top_tokens"])
    if "unk_rate" in tokens:  # (the rate, whether or not [UNK] is among the top tokens)
        rate = "n/a" if tokens["unk_rate"] is None else f"{tokens['unk_rate']:.3%}"
        rows += (f"<tr class='unk'><th>[UNK] rate</th><td class='n'>{tokens.get('unk_tokens', 0):,}</td>"
                 f"<td class='n'>{rate}</td></tr>")
    return f"<table class='tokens'><tr><th>token</th><th>count</th><th>share</th></tr>{rows}</table>"


def _skipped_files(data: dict) -> str:
    files = data["skips"]["skipped_files"]
    if not files:
        return ""
    rows = "".join(f"<li><code>{_e(f['path'])}</code>: {_e(f.get('detail') or f['reason'])}</li>" for f in files[:50])
    more = f"<li>… and {len(files) - 50:,} more</li>" if len(files) > 50 else ""
    return f"<p class='note'>Files skipped:</p><ul>{rows}{more}</ul>"


def _settings(data: dict) -> str:
    run = data["run"]
    shown = {**data["settings"]}
    if shown.get("split_bytes") is None and run.get("split_bytes"):  # auto: what the plan chose
        shown["split_bytes"] = f"auto ({run['split_bytes']:,} bytes)"
    rows = [(k.replace("_", "-"), _e(json.dumps(v) if isinstance(v, (dict, list)) else v))
            for k, v in sorted(shown.items())]
    rows.append(("tokenizer fingerprint", _e(run.get("tokenizer_fingerprint") or "")))
    for b in run.get("tokenizer_backend") or []:
        rows.append(("tokenizer backend", _e(f"{b.get('backend')} {b.get('version', '')} ({b.get('tasks')} tasks)")))
    return _table(rows)


def _languages(data: dict) -> str:
    """Each language's tokens before and after sampling (runs with languages)."""
    section = data.get("languages")
    if section is None:
        return ""
    alpha = section["alpha"]
    sampled = alpha is not None
    head = ["language", "id", "tokens read", "share", *(["target share", "rate"] if sampled else []),
            "tokens used", "share", "instances", "tokens in instances", "share"]
    rows = "".join(
        "<tr>" + "".join(f"<td>{v}</td>" for v in [
            _e(r["language"]), _num(r["id"]), _num(r["tokens"]), _share(r["share"]),
            *([_share(r["target_share"]), _e(f"{r['rate']:.3g}")] if sampled else []),
            _num(r["sampled_tokens"]), _share(r["sampled_share"]), _num(r["instances"]), _num(r["instance_tokens"]),
            _share(r["instance_share"])]) + "</tr>"
        for r in section["rows"])
    how = (f"sampled by --language-alpha {alpha:g} (q_i ∝ p_i^α)" if sampled
           else "the natural mix (no --language-alpha)")
    return (f"<section id='languages'><h2>Languages</h2><p class='note'>{_e(how)}: tokens before sampling, "
            f"used over the repeats, and in the instances written.</p><table><tr>"
            + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr>{rows}</table></section>")


def render_html(data: dict, plots: list[Plot], *, title: str = "mlm-pipeline report") -> str:
    """The page for :func:`.data.report_data` and its :func:`.plots.make_plots`."""
    by_name = {p.name: p for p in plots}
    run = data["run"]
    sections = "".join(_section(*s, by_name, data) for s in SECTIONS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title><style>{_STYLE}</style></head>
<body>
<h1>{_e(title)}</h1>
<p class="note">mlm-pipeline {_e(run.get('version'))}, run of {_e(run.get('created'))}, {_num(run.get('tasks'))} task{'' if run.get('tasks') == 1 else 's'}.</p>
{_warnings(data)}<h2>Summary</h2>{_summary(data)}
<h2>Not known</h2>{_not_known(data)}
{sections}
{_languages(data)}
{_skipped_files(data)}
<section id="settings"><h2>Settings</h2>{_settings(data)}</section>
</body></html>
"""


def write_report(data: dict, *, html_path: str | Path | None = None, png_dir: str | Path | None = None,
                 title: str = "mlm-pipeline report") -> list[Path]:
    """Draw the plots once and write the page and/or one PNG per plot; returns the files written."""
    plots = make_plots(data)
    written: list[Path] = []
    if png_dir is not None:
        png_dir = Path(png_dir)
        png_dir.mkdir(parents=True, exist_ok=True)
        for plot in plots:
            path = png_dir / f"{plot.name}.png"
            path.write_bytes(plot.png)
            written.append(path)
    if html_path is not None:
        html_path = Path(html_path)
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(render_html(data, plots, title=title), encoding="utf-8")
        written.append(html_path)
    return written


__all__ = ["SECTIONS", "render_html", "write_report"]
