"""The report's figures and text histograms on a real one-task run: axes a reader can read
(rows that span the timeline, whole-number ticks), gaps in histograms shown, the [UNK] rate in
the figure and the page's table, not only in a caption."""

from __future__ import annotations

import json
import re

import pytest

from conftest import DATA, VOCAB

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def one_task(tmp_path_factory) -> dict:
    """20 KB of the bundled Chinese novel under an English vocab, one task: [UNK] is its top token."""
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    d = tmp_path_factory.mktemp("plots")
    head = (DATA / "hongloumeng-300KB.txt").read_bytes()[:20_000]
    (d / "novel.txt").write_bytes(head[: head.rindex(b"\n") + 1])
    manifest = run_prepare(PrepareConfig(inputs=[str(d / "novel.txt")], output=str(d / "out"), tokenizer=str(VOCAB),
                                         workers=1, progress=False, sentence_split=True), show_progress=False)
    return manifest


def _axes():
    from matplotlib.figure import Figure

    return Figure().subplots()


def test_the_timeline_of_one_task_spans_its_axis_with_the_task_named(one_task):
    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.plots import draw_timeline

    tasks = report_data(one_task)["tasks"]
    assert len(tasks) == 1
    ax = _axes()
    draw_timeline(ax, tasks)
    assert ax.get_ylim() == (-0.5, 0.5)  # (was -0.4 to 0.4: the bar's own edges)
    assert list(ax.get_yticks()) == [0] and [t.get_text() for t in ax.get_yticklabels()] == [tasks[0]["task_id"]]


def test_the_masked_positions_axis_has_whole_number_ticks(one_task):
    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.plots import draw_masked_per_instance

    hist = report_data(one_task)["masking"]["masked_per_instance_histogram"]
    top_two = dict(sorted(hist.items(), key=lambda kv: -kv[1])[:2])  # a narrow run: ticks at halves before
    for h in (hist, top_two):
        ax = _axes()
        draw_masked_per_instance(ax, h)
        ax.figure.canvas.draw()
        ticks = [x for x in ax.get_xticks() if ax.get_xlim()[0] <= x <= ax.get_xlim()[1]]
        assert ticks and all(float(x).is_integer() for x in ticks), ticks


def test_text_histograms_show_empty_bins_as_rows_of_zero(one_task):
    from mlm_pipeline.report.text import render_report

    # short instances get few masks: 1 and 20 masked positions, nothing between
    gapped = {**one_task, "totals": {**one_task["totals"], "masked_per_instance_histogram": {"1": 5, "20": 100}}}
    text = render_report(gapped)
    rows = text.split("masked positions per instance\n", 1)[1].split("\n\n", 1)[0].split("\n")
    assert [r.split()[0] for r in rows] == ["1-3", "4-6", "7-9", "10-12", "13-15", "16-18", "19-20"]
    assert [re.search(r"(\d+) \(", r).group(1) for r in rows] == ["5", "0", "0", "0", "0", "0", "100"]
    assert "#" not in rows[1] and "#" in rows[0] and "#" in rows[-1]


def test_the_unk_rate_is_in_the_figure_and_the_pages_table(one_task):
    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.html import render_html
    from mlm_pipeline.report.plots import ACCENT, COLOR, draw_top_tokens, make_plots

    data = report_data(one_task)
    tokens = data["tokens"]
    assert tokens["top_tokens"][0]["token"] == "[UNK]"
    ax = _axes()
    draw_top_tokens(ax, tokens)
    rate = f"[UNK] rate {tokens['unk_rate']:.3%} ({tokens['unk_tokens']:,} of {tokens['tokens']:,} tokens)"
    assert ax.get_title() == rate  # drawn in the PNG, which --png writes without its caption
    from matplotlib.colors import to_hex
    colors = [to_hex(p.get_facecolor()) for p in ax.patches]
    assert colors[0] == ACCENT and set(colors[1:]) == {COLOR}
    page = render_html(data, make_plots(data))
    table = page.split("<table class='tokens'>", 1)[1].split("</table>", 1)[0]
    assert f"<th>[UNK] rate</th><td class='n'>{tokens['unk_tokens']:,}</td><td class='n'>{tokens['unk_rate']:.3%}</td>" \
        in table
    json.dumps(data)  # (plain JSON types)
