"""``report --json`` and ``report --png``: every figure checked against the shards and the input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT, bert_text_documents

REFERENCE_WHY = "not tracked in reference mode"


def cli(*args, check_code: int = 0):
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == check_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """WikiText and Google's sample in 256 KB tasks, an empty file skipped; Parquet, static masks."""
    d = tmp_path_factory.mktemp("report")
    (d / "empty.txt").write_bytes(b"")
    out = d / "out"
    cli("prepare", WIKITEXT, SAMPLE_TEXT, d / "empty.txt", "-o", out, "-t", VOCAB, "--format", "parquet",
        "--split-size", "256KB", "--no-progress")
    return out


def _rows(out: Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    tables = [pq.read_table(out / s["path"]).to_pydict() for s in manifest["shards"]]
    return {k: [v for t in tables for v in t[k]] for k in tables[0]}


def test_report_json_matches_the_shards_and_the_input(prepared, tok):
    data = json.loads(cli("report", prepared, "--json").stdout)
    rows = _rows(prepared)
    n = len(rows["input_ids"])
    assert data["output"]["instances"] == n > 1000
    lengths = np.array([len(x) for x in rows["input_ids"]])
    assert data["lengths"]["instance_length_histogram"] == {str(k): int(v) for k, v in zip(*np.unique(lengths, return_counts=True))}
    assert data["lengths"]["max_seq_length"] == 128
    assert data["lengths"]["padding_share"] == pytest.approx(1 - lengths.sum() / (n * 128))
    masked = np.array([len(x) for x in rows["masked_lm_positions"]])
    assert data["masking"]["masked_per_instance_histogram"] == {str(k): int(v) for k, v in zip(*np.unique(masked, return_counts=True))}
    assert data["masking"]["masked_tokens"] == masked.sum()
    labels = np.array(rows["next_sentence_labels"])
    assert data["pairs"]["random_next"] == int((labels == 1).sum())
    assert data["pairs"]["random_next_share"] == pytest.approx(float((labels == 1).mean()))
    # the input tokens, counted here with the tokenizer itself
    ids, _ = tok.encode_batch([s for path in (WIKITEXT, SAMPLE_TEXT) for doc in bert_text_documents(path) for s in doc])
    counts = np.bincount(ids, minlength=tok.vocab_size)
    unk = tok.tokenizer.token_to_id("[UNK]")
    assert data["tokens"]["tokens"] == len(ids)
    assert data["tokens"]["unk_tokens"] == counts[unk] > 0
    assert data["tokens"]["unk_rate"] == pytest.approx(counts[unk] / len(ids))
    top = [(t["token"], t["count"]) for t in data["tokens"]["top_tokens"]]
    expected = [(tok.tokenizer.id_to_token(int(i)), int(counts[i])) for i in np.argsort(-counts, kind="stable")[:len(top)]]
    assert len(top) == 25 and top == expected  # these are frequent in every task: exact sums
    kept = list(json.loads((prepared / "manifest.json").read_text())["totals"]["top_token_counts"].values())
    assert len(kept) == 1000 and kept == sorted(kept, reverse=True)  # the manifest keeps the 1000 most frequent
    # skips, per-task timings, settings; nothing unknown in the default mode
    assert data["skips"]["files"] == {"empty_file": 1} and data["skips"]["documents"] == {}
    tasks = data["tasks"]
    assert len(tasks) == data["run"]["tasks"] >= 4
    assert sum(t["bytes_read"] for t in tasks) == data["input"]["bytes_read"]
    assert sum(t["instances"] for t in tasks) == n
    assert all(t["seconds"] > 0 and t["started"] > 1.7e9 and t["mb_per_s"] > 0 for t in tasks)
    assert min(t["start_offset"] for t in tasks) == 0
    assert data["settings"]["max_seq_length"] == 128 and data["settings"]["format"] == "parquet"
    assert data["not_known"] == {}


def test_report_png_writes_one_image_per_plot(prepared, tmp_path):
    from PIL import Image

    r = cli("report", prepared, "--png", tmp_path / "png")
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == sorted(f"{n}.png" for n in ("instance_length", "tokens_per_instance", "masked_per_instance",
                                                 "random_next", "task_throughput", "skips", "top_tokens"))
    for name in names:
        with Image.open(tmp_path / "png" / name) as im:
            assert im.format == "PNG" and im.width >= 700 and im.height >= 150
            assert np.asarray(im.convert("L")).std() > 10  # something is drawn
        assert f"wrote {tmp_path / 'png' / name}" in r.stdout
    assert "instance length" in r.stdout  # the text report too


def test_report_says_what_reference_mode_does_not_record(tmp_path):
    out = tmp_path / "ref"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--reference", "--no-progress")
    data = json.loads(cli("report", out, "--json", "--html", tmp_path / "r.html").stdout)
    known = data["not_known"]
    assert set(known) == {"unk_rate", "top_tokens", "short_target_documents", "truncated_pairs", "chunks_without_pair"}
    assert all(why.startswith(REFERENCE_WHY) for why in known.values())
    # what is known is there, what is not is absent (never a 0)
    assert "unk_rate" not in data["tokens"] and "top_tokens" not in data["tokens"]
    assert "truncated_pairs" not in data["pairs"] and data["pairs"]["random_next"] > 0
    assert data["tokens"]["tokens"] == 1019 and data["masking"]["masked_tokens"] > 0
    page = (tmp_path / "r.html").read_text()
    assert page.count("<img class='plot'") == 5  # no skips, no token counts
    assert "Not known: not tracked in reference mode" in page


def test_report_without_nsp_or_static_masks_names_the_reason(tmp_path):
    out = tmp_path / "tokens"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--objective", "tokens", "--no-progress")
    data = json.loads(cli("report", out, "--json").stdout)
    assert "makes no next-sentence pairs" in data["not_known"]["random_next_share"]
    assert "masks at load time" in data["not_known"]["masked_per_instance"]
    assert data["masking"] == {} and "random_next" not in data["pairs"]


def test_report_of_an_older_output_says_what_it_lacks(prepared):
    """A manifest written before per-task timings and token counts existed: those are not known
    (with the reason), and nothing else changes."""
    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.data import OLDER_WHY
    from mlm_pipeline.report.plots import make_plots

    manifest = json.loads((prepared / "manifest.json").read_text())
    full = report_data(manifest)
    old = {k: v for k, v in manifest.items() if k != "task_timings"}
    old["totals"] = {k: v for k, v in manifest["totals"].items() if k not in ("unk_tokens", "top_token_counts")}
    data = report_data(old)
    assert data["not_known"] == {"task_throughput": OLDER_WHY, "unk_rate": OLDER_WHY, "top_tokens": OLDER_WHY}
    assert data["tasks"] == [] and data["tokens"] == {"tokens": full["tokens"]["tokens"]}
    assert {k: data[k] for k in ("lengths", "pairs", "masking", "skips", "settings")} == \
        {k: full[k] for k in ("lengths", "pairs", "masking", "skips", "settings")}
    assert [p.name for p in make_plots(data)] == ["instance_length", "tokens_per_instance", "masked_per_instance",
                                                  "random_next", "skips"]


def test_plots_without_matplotlib_say_which_extra(prepared, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = sys.modules['matplotlib.figure'] = None; "
            "from mlm_pipeline.cli import main; sys.argv[0] = 'mlm-pipeline'; main()")
    proc = subprocess.run([sys.executable, "-c", code, "report", str(prepared), "--html", str(tmp_path / "r.html")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "plots need matplotlib" in proc.stderr and "'.[report]'" in proc.stderr
    assert not (tmp_path / "r.html").exists()
    proc = subprocess.run([sys.executable, "-c", code, "report", str(prepared), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0 and json.loads(proc.stdout)["output"]["instances"] > 0  # JSON needs no plots


def test_plot_labels_and_many_tasks(prepared):
    """Tokens no installed font can draw are labelled by code point, ``$`` is not math; a run of
    thousands of tasks is drawn as a histogram and a scatter, quickly."""
    import time

    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.html import render_html
    from mlm_pipeline.report.plots import make_plots, token_label

    assert token_label("the") == "the" and token_label("##ing") == "##ing"
    assert token_label("$") == "\\$" and token_label("a\u0378") == "aU+0378"  # (unassigned: no font has it)
    manifest = json.loads((prepared / "manifest.json").read_text())
    many = dict(manifest, task_timings=[dict(t, task_id=f"{i:06d}", started=t["started"] + i)
                                        for i in range(5000) for t in manifest["task_timings"][:1]])
    data = report_data(many)
    started = time.perf_counter()
    plots = {p.name: p for p in make_plots(data)}
    assert time.perf_counter() - started < 30 and len(data["tasks"]) == 5000
    assert plots["task_throughput"].caption.startswith("5000 tasks")
    page = render_html(data, list(plots.values()))
    assert "<code>the</code>" in page and page.count("<tr><td><code>") == 25


def test_text_report_shows_the_unknown_share_and_the_most_frequent_tokens(prepared):
    totals = json.loads((prepared / "manifest.json").read_text())["totals"]
    text = cli("report", prepared).stdout
    unknown, tokens = totals["unk_tokens"], totals["tokens"]
    assert f"[UNK] tokens {unknown:,} ({unknown / tokens:.3%} of the tokens)" in text
    token, count = max(totals["top_token_counts"].items(), key=lambda kv: kv[1])
    assert f"most frequent tokens: {token} {count:,}, " in text and token == "the"


def test_text_report_of_reference_mode_says_the_token_counts_are_not_tracked(tmp_path):
    out = tmp_path / "ref"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--reference", "--no-progress")
    assert f"[UNK] tokens, most frequent tokens: {REFERENCE_WHY}" in cli("report", out).stdout


def test_html_summary_shows_the_pair_figures_the_text_report_prints(prepared):
    """The page's summary has the NSP (or ELECTRA) counts the text report prints, and an automatic
    split size as the size the plan chose."""
    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.html import render_html

    manifest = json.loads((prepared / "manifest.json").read_text())
    t = manifest["totals"]
    page = render_html(report_data(manifest), [])
    for key, label in (("truncated_pairs", "truncated pairs"),
                       ("short_target_documents", "documents with a short target length")):
        assert f"<th>{label}</th><td class='n'>{t[key]:,}</td>" in page, key
    assert "<th>split-bytes</th><td class=''>256000</td>" in page
    electra = {**manifest, "config": {**manifest["config"], "split_bytes": None}, "split_bytes": 4194304,
               "totals": {**t, "truncated_examples": 970, "dropped_tokens": 85643, "single_segment": 12}}
    page = render_html(report_data(electra), [])
    assert "<th>tokens dropped by truncation</th><td class='n'>85,643</td>" in page
    assert "<th>split-bytes</th><td class=''>auto (4,194,304 bytes)</td>" in page


def test_report_flags_mostly_random_next_pairs_and_the_way_out(tmp_path):
    """The bundled novel is one document of paragraph-long lines: read a line per sentence, most
    pairs are random-next and the report says why and what to do; split into sentences, they are
    about half, and it says nothing."""
    from conftest import DATA

    novel = DATA / "hongloumeng-300KB.txt"
    cli("prepare", novel, "-o", tmp_path / "lines", "-t", VOCAB, "--no-progress")
    text = cli("report", tmp_path / "lines").stdout
    assert "of the pairs are random-next (over 70%): most pairs were cut from a single sentence" in text
    assert "--sentence-split splits lines into sentences" in text
    cli("prepare", novel, "-o", tmp_path / "split", "-t", VOCAB, "--no-progress", "--sentence-split")
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    assert 0.4 < manifest["totals"]["random_next"] / manifest["totals"]["instances"] < 0.6
    assert "random-next (over" not in cli("report", tmp_path / "split").stdout
    # the page and the JSON carry the text report's warnings too ([UNK] over 20%, random-next over 70%)
    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.html import render_html

    data = json.loads(cli("report", tmp_path / "lines", "--json").stdout)
    assert [w.split(":")[0] for w in data["warnings"]] == [
        w.split(":")[0] for w in report_data(json.loads((tmp_path / "lines" / "manifest.json").read_text()))["warnings"]]
    assert any("of the pairs are random-next (over 70%)" in w for w in data["warnings"])
    assert any("of the tokens are [UNK]: the vocabulary does not fit this text" in w for w in data["warnings"])
    page = render_html(data, [])
    assert "<h2>Warnings</h2>" in page and "of the pairs are random-next (over 70%)" in page
    assert "random-next (over" not in render_html(report_data(manifest), [])


def test_report_of_a_run_that_read_nothing_says_so(tmp_path):
    """No document read: the totals lack the token and pair counts because nothing was read, not
    because of reference mode, an older version or the objective, which the report said."""
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n")
    out = tmp_path / "out put"  # (a path with a space: the commands the summary suggests are quoted)
    got = cli("prepare", blank, "-o", out, "-t", VOCAB, "--no-progress", check_code=2)
    assert f"mlm-pipeline report '{out}'" in got.stdout + got.stderr
    text = cli("report", out).stdout
    assert "[UNK] tokens, most frequent tokens: no document was read" in text
    data = json.loads(cli("report", out, "--json").stdout)
    assert {data["not_known"][k] for k in ("unk_rate", "top_tokens", "random_next_share")} == {"no document was read"}
    assert any("no document was read" in w for w in data["warnings"])


def test_the_length_plot_shows_a_run_whose_instances_all_have_one_length(prepared, monkeypatch):
    """A step curve of one point draws nothing (Chinese text, --objective tokens): it starts at 0."""
    import matplotlib.axes

    from mlm_pipeline.report import report_data
    from mlm_pipeline.report.plots import make_plots

    steps, step = [], matplotlib.axes.Axes.step
    monkeypatch.setattr(matplotlib.axes.Axes, "step",
                        lambda self, x, y, *a, **k: (steps.append((list(x), list(y))), step(self, x, y, *a, **k))[1])
    manifest = json.loads((prepared / "manifest.json").read_text())
    one_length = {**manifest, "totals": {**manifest["totals"], "instance_length_histogram": {"128": 725}}}
    assert "tokens_per_instance" in {p.name for p in make_plots(report_data(one_length))}
    assert steps == [([127, 128], [0.0, 1.0])]


def test_tokens_left_out_of_every_instance_are_warned_about_for_each_objective(tmp_path):
    """A Chinese novel and a WikiExtractor file, a paragraph per line: ELECTRA's examples drop the
    tail of each line that does not fit (about a quarter of the tokens at 128), and the summary and
    the report say so with what to change; BERT's pairs count what truncation removed; packing
    loses nothing and is not warned about."""
    from conftest import VOCAB
    from mlm_pipeline import prepare
    from mlm_pipeline.report import render_report, render_summary
    from mlm_pipeline.report.data import LOST_TOKENS_WARNING, lost_tokens, report_data

    repo = Path(__file__).resolve().parents[2]
    inputs = [str(repo / "tests" / "data" / "hongloumeng-300KB.txt"), str(repo / "sample" / "wikiextractor-AA.txt")]

    def run(name, **kw):
        return prepare(inputs=inputs, output=str(tmp_path / name), tokenizer=str(VOCAB), workers=1, progress=False,
                       max_seq_length=128, show_progress=False, **kw)

    electra = run("electra", objective="electra")
    lost, read = lost_tokens(electra)
    assert lost == electra["totals"]["dropped_tokens"] and read == electra["totals"]["tokens"]
    assert lost / read > 0.2
    summary = render_summary(electra, str(tmp_path / "electra"))
    assert f"warning: {lost / read:.0%} of the tokens read ({lost:,} of {read:,}) are in no instance" in summary
    assert "--sentence-split splits lines into sentences" in summary and "--max-seq-length (now 128) keeps more" in summary
    assert any("are in no instance" in w for w in report_data(electra)["warnings"])
    assert "are in no instance" in render_report(electra)

    nsp = run("nsp")
    lost, read = lost_tokens(nsp)
    # every truncated pair lost at least one token; the token counts match the instances written
    assert nsp["totals"]["truncated_tokens"] >= nsp["totals"]["truncated_pairs"] > 0
    assert lost == nsp["totals"]["truncated_tokens"] and read == nsp["totals"]["tokens"]
    assert ("are in no instance" in render_summary(nsp, "o")) == (lost / read > LOST_TOKENS_WARNING)

    # split into sentences, ELECTRA still ends each example inside a sentence (its own rule): less is
    # lost, still over the threshold at 128, and the advice is the length alone
    split = run("electra-split", objective="electra", sentence_split=True)
    split_lost, split_read = lost_tokens(split)
    assert LOST_TOKENS_WARNING < split_lost / split_read < lost_tokens(electra)[0] / lost_tokens(electra)[1] / 1.5
    warned = [w for w in report_data(split)["warnings"] if "are in no instance" in w]
    assert warned and "--sentence-split" not in warned[0] and "--max-seq-length (now 128)" in warned[0]
    packed = run("packed", objective="packed")
    assert lost_tokens(packed)[0] == 0 and not any("are in no instance" in w for w in report_data(packed)["warnings"])


@pytest.mark.parametrize("crafted", [{"abc": 5}, {"12": "x"}, {"-3": 2}, {"1e309": 1}, {"9" * 5000: 1}, {"7": None},
                                     [1, 2]], ids=["word", "count", "negative", "float", "long", "null", "list"])
def test_a_crafted_histogram_in_the_manifest_is_a_clean_error(prepared, crafted):
    """``report`` printed a traceback for a histogram key that is not a number: the text and the
    JSON/HTML data refuse it, naming the statistic (the CLI: exit 2, below)."""
    from mlm_pipeline.errors import InspectError
    from mlm_pipeline.report import render_report, report_data

    manifest = json.loads((prepared / "manifest.json").read_text())
    for name in ("instance_length_histogram", "masked_per_instance_histogram"):
        edited = {**manifest, "totals": {**manifest["totals"], name: crafted}}
        for render in (render_report, report_data):
            with pytest.raises(InspectError, match=rf"^manifest.json: totals.{name} .*the manifest is damaged or was edited"):
                render(edited)


def test_report_of_a_crafted_histogram_exits_2_and_counts_of_0_are_shown(prepared, tmp_path):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["totals"]["masked_per_instance_histogram"] = {"abc": 5}
    (out / "manifest.json").write_text(json.dumps(manifest))
    for extra in ([], ["--json"]):
        got = cli("report", out, *extra, check_code=2)
        assert "error: manifest.json: totals.masked_per_instance_histogram holds 'abc': '5', not a count" in got.stderr
    # counts of 0 (nothing wrong in their type) are shown, not divided by
    manifest["totals"]["masked_per_instance_histogram"] = {"0": 0, "3": 0}
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "masked positions per instance" in cli("report", out).stdout


def test_tokens_lost_count_a_documents_own_tokens_only(tmp_path):
    """Documents of one long sentence each: every pair is that sentence as A and a random B from
    another document, both truncated. What a document loses is its A's cut (the random B's tokens
    are another document's, which keeps them in its own pairs): the count is exactly the tokens read
    less those of every A (it counted the random Bs' cuts too, over 100% of the tokens read)."""
    from mlm_pipeline import prepare
    from mlm_pipeline.report.data import lost_tokens

    words = WIKITEXT.read_text(encoding="utf-8").split()
    corpus = tmp_path / "long-sentences.txt"
    corpus.write_text("\n\n".join(" ".join(words[i * 400:(i + 1) * 400]) for i in range(40)) + "\n")
    manifest = prepare(inputs=[str(corpus)], output=str(tmp_path / "out"), tokenizer=str(VOCAB), workers=1,
                       progress=False, show_progress=False, max_seq_length=128, dupe_factor=1, format="parquet")
    table = pq.read_table(tmp_path / "out" / manifest["shards"][0]["path"], columns=["segment_ids", "input_mask"])
    a_tokens = sum(sum(1 for s, m in zip(seg, mask) if m and s == 0) - 2  # less [CLS] and the first [SEP]
                   for seg, mask in zip(table.column("segment_ids").to_pylist(), table.column("input_mask").to_pylist()))
    lost, read = lost_tokens(manifest)
    assert manifest["totals"]["random_next"] == manifest["totals"]["instances"] == 40
    assert lost == read - a_tokens and 0 < lost < read


def test_a_few_percent_unk_is_warned_about_with_the_words_read_as_unk(tmp_path, tok):
    """English with a fifth of the bundled Chinese novel under an English vocab: about 6% [UNK],
    which passed silently (the warning fired above 20%). Now warned, naming the words most often
    read as [UNK], each one a word the vocab cannot spell; English alone is not warned about."""
    from conftest import DATA
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.report import report_data

    novel = DATA / "hongloumeng-300KB.txt"
    head = novel.read_bytes()[:80_000]
    (tmp_path / "novel.txt").write_bytes(head[: head.rindex(b"\n") + 1])

    def run(inputs, out):
        return run_prepare(PrepareConfig(inputs=[str(p) for p in inputs], output=str(tmp_path / out), tokenizer=str(VOCAB),
                                         objective="tokens", dupe_factor=1, split_bytes="256KB", workers=1,
                                         progress=False), show_progress=False)

    manifest = run([WIKITEXT, tmp_path / "novel.txt"], "mixed")
    t = manifest["totals"]
    assert 0.03 < t["unk_tokens"] / t["tokens"] < 0.2
    words = t["unknown_words"]
    assert len(words) >= 20 and sum(words.values()) <= t["unk_tokens"]
    unk = tok.tokenizer.token_to_id("[UNK]")
    for word in words:  # each a word of the input the vocab cannot spell
        assert tok.encode_batch([word])[0].tolist() == [unk], word
    assert max(words, key=words.get) == "了"  # the novel's most frequent unknown character
    warned = [w for w in report_data(manifest)["warnings"] if "of the tokens are [UNK]" in w]
    assert len(warned) == 1 and f"{t['unk_tokens'] / t['tokens']:.1%} of the tokens are [UNK]" in warned[0]
    assert f"'了' {words['了']:,}" in warned[0]
    english = run([WIKITEXT], "english")
    assert not any("[UNK]" in w for w in report_data(english)["warnings"])
    assert "unknown_words" not in english["totals"]  # (0.004%: no block searched for its words)

