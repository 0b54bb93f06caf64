"""The WikiText-2/-103 dataset files (``wiki.train.tokens``): one article per document, on the
bundled 1 MB of WikiText-2 (``sample/wikitext2-train-1MB.txt``), whole and cut into ranges."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest

from conftest import VOCAB, WIKITEXT
from mlm_pipeline.read import ReadOptions, detect_format
from mlm_pipeline.read.sample import InputSample

from .helpers import read_cuts, read_split, read_whole

TITLE = re.compile(r"^ = [^=].* = $")


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("wikitext") / "wiki.train.tokens"
    shutil.copyfile(WIKITEXT, path)
    return path


def _articles(path) -> list[tuple[str, list[str]]]:
    """(title, paragraphs) of each article, by the dataset's layout: a title line opens an
    article, heading and blank lines are not text; its debris undone."""
    articles: list[tuple[str, list[str]]] = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if TITLE.match(line):
            articles.append((line.strip(" ="), []))
        elif line.strip() and not line.startswith(" = = ") and articles:
            for mark, joined in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")):
                line = line.replace(mark, joined)
            articles[-1][1].append(" ".join(line.replace("<unk>", " ").split()))  # (no tokenizer: dropped)
    return [a for a in articles if a[1]]


def test_the_dataset_names_are_detected_and_other_names_are_text(tokens_file, tmp_path):
    assert detect_format(InputSample(str(tokens_file))) == "wikitext"
    for name in ("wiki.valid.raw", "wiki.test.tokens"):
        (tmp_path / name).write_bytes(b" \n = Title = \n \n Text .\n")
        assert detect_format(InputSample(str(tmp_path / name))) == "wikitext"
    assert detect_format(InputSample(str(WIKITEXT))) == "text"  # another name: by content, text


def test_each_article_is_one_document_of_its_paragraphs_sentences(tokens_file):
    docs, stats = read_whole(tokens_file, "wikitext")
    articles = _articles(tokens_file)
    assert len(docs) == len(articles) == 63 and stats.documents_read == 63
    for doc, (title, paragraphs) in zip(docs, articles):
        text = " ".join(doc)
        assert text.startswith(paragraphs[0][:40]) and text.endswith(paragraphs[-1][-40:])
        assert not any(s.startswith("= ") for s in doc)  # headings dropped
    assert sum(len(d) for d in docs) > 2 * sum(len(p) for _, p in articles)  # paragraphs split into sentences


@pytest.mark.parametrize("split_bytes", [4096, 65536, 300_000])
def test_ranges_give_every_article_once(tokens_file, split_bytes):
    whole, _ = read_whole(tokens_file, "wikitext")
    assert read_split(tokens_file, "wikitext", split_bytes)[0] == whole
    size = tokens_file.stat().st_size
    assert read_cuts(tokens_file, "wikitext", range(1, size, split_bytes + 17))[0] == whole


def test_prepare_reads_articles_and_the_planner_points_a_text_wikitext_at_the_format(tokens_file, tmp_path, caplog):
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    def run(inputs, out, **kw):
        return run_prepare(PrepareConfig(inputs=[str(p) for p in inputs], output=str(tmp_path / out), tokenizer=str(VOCAB),
                                         workers=1, progress=False, **kw), show_progress=False)

    articles = run([tokens_file], "articles")
    assert articles["totals"]["documents_read"] == 63
    share = articles["totals"]["random_next"] / articles["totals"]["instances"]
    assert 0.4 < share < 0.6  # Google's algorithm on documents of many sentences
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        paragraphs = run([WIKITEXT], "paragraphs")
    assert "--input-format wikitext reads them an article per document" in caplog.text
    assert paragraphs["totals"]["documents_read"] > 10 * 63  # as text: a document per paragraph
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        run([WIKITEXT], "split", sentence_split=True)  # lines split into sentences on purpose: no hint
    assert "wikitext" not in caplog.text
    named = run([WIKITEXT], "named", input_format="wikitext")
    assert named["totals"]["documents_read"] == 63 and named["shards"][0]["sha256"] == articles["shards"][0]["sha256"]


def test_text_before_the_first_title_is_an_article_and_an_empty_title_none(tmp_path):
    path = tmp_path / "wiki.valid.tokens"
    path.write_bytes(b" Lead text . More .\n \n = A = \n \n = = Part = = \n \n Body one . Two .\n \n = Empty = \n \n"
                     b" = B = \n Last .\n")
    docs, stats = read_whole(path, "wikitext", ReadOptions())
    assert docs == [["Lead text .", "More ."], ["Body one .", "Two ."], ["Last ."]]
    assert stats.documents_read == 3 and not stats.documents_skipped


def test_the_datasets_debris_is_undone_and_unk_dropped_without_a_tokenizer(tokens_file):
    raw = tokens_file.read_text(encoding="utf-8")
    assert raw.count("<unk>") == 5690 and raw.count(" @-@ ") == 1547  # (the sample's own figures: 5,636 outside titles and headings)
    docs, _ = read_whole(tokens_file, "wikitext", ReadOptions())
    text = "\n".join(s for d in docs for s in d)
    for debris in ("<unk>", "@-@", "@,@", "@.@", "  "):
        assert debris not in text
    assert "17th-place finish" in text and "play-offs" in text  # " @-@ " -> "-"
    assert "over 500,000 copies" in text and "drew 4.28 million" in text
    docs, _ = read_whole(tokens_file, "wikitext", ReadOptions(unknown_text="[UNK]"))
    assert sum(s.count("[UNK]") for d in docs for s in d) == 5636


@pytest.mark.parametrize("flavor", ["bert", "electra"])
def test_unk_is_the_tokenizers_unknown_token_and_counted_as_such(tokens_file, tmp_path, flavor):
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.report.data import report_data
    from mlm_pipeline.report.text import render_report

    manifest = run_prepare(PrepareConfig(inputs=[str(tokens_file)], output=str(tmp_path / "out"), tokenizer=str(VOCAB),
                                         tokenizer_flavor=flavor, objective="tokens", dupe_factor=1,
                                         workers=1, progress=False), show_progress=False)
    totals = manifest["totals"]
    # every <unk> of the text (not of titles, headings) is one [UNK], none is '< un ##k >'; the
    # vocab cannot spell 9 other words of this text (the count without the reader's mapping)
    assert totals["unk_tokens"] == 5636 + 9
    top = totals["top_token_counts"]
    assert top["[UNK]"] == 5636 + 9 and top.get("un", 0) < 50 and top.get("@", 0) == 0
    assert report_data(manifest)["tokens"]["unk_rate"] == pytest.approx(5645 / totals["tokens"])
    # the input's own marks are counted as such: 2.8% [UNK], but not the vocabulary's fault
    assert totals["unknown_marked"] == 5636
    assert not any("[UNK]" in w for w in report_data(manifest)["warnings"])
    assert "5,636 of them marked unknown in the input" in render_report(manifest)


def test_the_quickstart_reads_its_wikitext_sample_without_debris(tmp_path):
    """The quickstart's own prepare command (from scripts/quickstart.sh, its output moved here):
    its first instances show no ``< un ##k >``, no ``@ - @`` and no ``= = heading = =`` line."""
    import shlex

    from typer.testing import CliRunner

    from conftest import REPO
    from mlm_pipeline.cli import app

    script = (REPO / "scripts" / "quickstart.sh").read_text().replace("\\\n", " ")
    line = next(ln for ln in script.split("\n") if "mlm-pipeline prepare" in ln)
    argv = shlex.split(line)[1:]
    argv = [a for a in argv if a != "$@"]
    argv[argv.index("--output") + 1] = str(tmp_path / "out")
    assert "--input-format" in argv and argv[argv.index("--input-format") + 1] == "wikitext"
    argv = [str(REPO / a) if a.startswith("sample/") else a for a in argv]
    result = CliRunner().invoke(app, [*argv, "--workers", "1"])
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "-n", "3"])
    assert shown.exit_code == 0 and shown.output.count("[CLS]") == 3, shown.output
    assert "< un ##k >" not in shown.output and "@ - @" not in shown.output and "= =" not in shown.output
    # its warnings name no fault of the vocab (the <unk> are the dataset's) and no flag for text files
    from mlm_pipeline.report.data import report_data

    warned = report_data(json.loads((tmp_path / "out" / "manifest.json").read_text()))["warnings"]
    assert not any("[UNK]" in w or "--sentence-split" in w for w in warned), warned
