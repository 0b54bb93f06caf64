"""The Python API: the package exports it lazily, and every example of ``docs/api.md`` runs.

The page's ```python blocks run in order, in one namespace, in a fresh directory holding the
bundled ``sample/`` (as from a clone's root): a block that fails fails this test with its number.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, SAMPLE

API_DOC = REPO / "docs" / "api.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_import_is_light_and_names_resolve():
    code = ("import sys, mlm_pipeline as m; heavy = ('numpy', 'torch', 'pyarrow', 'tokenizers', 'matplotlib');"
            "print(sorted(x for x in heavy if x in sys.modules));"
            "from mlm_pipeline import prepare, PrepareConfig, report_data;"
            "print('torch' in sys.modules, 'matplotlib' in sys.modules);"
            "missing = [n for n in m.__all__ if getattr(m, n, None) is None]; print(missing)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["[]", "False False", "[]"]
    import mlm_pipeline

    assert mlm_pipeline.prepare.__module__ == "mlm_pipeline.pipeline"
    assert "MLMDataset" in dir(mlm_pipeline)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mlm_pipeline.nope  # noqa: B018


def test_every_example_of_the_api_page_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch", reason="the last examples need the torch extra")
    pytest.importorskip("matplotlib", reason="write_report needs the report extra")
    blocks = python_blocks(API_DOC.read_text())
    assert len(blocks) >= 6
    (tmp_path / "sample").symlink_to(SAMPLE)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__api_doc__"}
    for i, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"docs/api.md block {i}", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - reported with the block's number
            pytest.fail(f"docs/api.md block {i} failed: {type(exc).__name__}: {exc}\n{block}")
    printed = capsys.readouterr().out
    assert "max-seq-length: 128 in the existing run, 64 now" in printed
    assert "cannot exceed --max-seq-length" in printed
    assert "[CLS]" in printed and "random-next share" in printed
    assert (tmp_path / "out-api" / "manifest.json").exists() and (tmp_path / "report.html").exists()


def test_prepare_takes_paths_a_dict_or_a_config(tmp_path):
    from mlm_pipeline import ConfigError, PrepareConfig, prepare

    from conftest import SAMPLE_TEXT, VOCAB

    by_path = prepare(inputs=SAMPLE_TEXT, output=tmp_path / "a", tokenizer=VOCAB, workers=1)
    as_dict = prepare({"inputs": [str(SAMPLE_TEXT)], "output": str(tmp_path / "b"), "tokenizer": str(VOCAB)}, workers=1)
    config = PrepareConfig(inputs=[str(SAMPLE_TEXT)], output=str(tmp_path / "c"), tokenizer=str(VOCAB), workers=1)
    from_config = prepare(config)
    assert [s["sha256"] for s in by_path["shards"]] == [s["sha256"] for s in as_dict["shards"]] == \
        [s["sha256"] for s in from_config["shards"]]
    assert (tmp_path / "a" / "manifest.json").exists() and by_path["totals"]["documents_read"] == 3
    with pytest.raises(ConfigError, match="max-seq-length"):
        prepare(config, output=str(tmp_path / "d"), max_seq_length=2)
    with pytest.raises(TypeError, match="PrepareConfig or a dict"):
        prepare(["x.txt"])
