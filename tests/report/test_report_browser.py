"""``report --html`` in a real browser: Debian's Chromium, headless, driven by Playwright.

The page is opened from disk with the network cut off (it must be self-contained); every plot must
be decoded and laid out, the console must hold no error, and a screenshot is written beside it.
``scripts/setup.sh all`` installs Chromium (apt-get, as root); the test skips only where it cannot
be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT

PLOTS = ["instance_length", "tokens_per_instance", "masked_per_instance", "random_next", "task_throughput", "skips",
         "top_tokens"]
# as the machine's own Chromium needs them headless: no sandbox as root, no background connections
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail("no Chromium on PATH, yet this machine can install it (root, apt-get): run scripts/setup.sh all")
    pytest.skip("no Chromium on PATH and no way to install it here (needs root and apt-get: apt-get install chromium)")


def test_html_report_renders_in_chromium(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra: scripts/setup.sh all")
    browser_path = chromium()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(WIKITEXT, corpus / "a.txt")
    shutil.copy(SAMPLE_TEXT, corpus / "b.txt")
    (corpus / "c_empty.txt").write_bytes(b"")
    out, page_path = tmp_path / "out", tmp_path / "report.html"
    env = {**os.environ, "COLUMNS": "200"}
    for args in (["prepare", corpus, "-o", out, "-t", VOCAB, "--split-size", "512KB", "--no-progress"],
                 ["report", out, "--html", page_path]):
        proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)], capture_output=True,
                              text=True, env=env)
        assert proc.returncode == 0, proc.stderr
    assert f"wrote {page_path}" in proc.stdout

    problems: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri(), wait_until="load")
            plots = page.eval_on_selector_all(
                "img.plot", "els => els.map(e => ({section: e.closest('section').id, done: e.complete, "
                "w: e.naturalWidth, h: e.naturalHeight, shown: e.getBoundingClientRect().width}))")
            title = page.title()
            text = page.inner_text("body")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert [r for r in requests if not r.startswith(("file:", "data:"))] == []  # self-contained
    assert [p["section"] for p in plots] == PLOTS
    for plot in plots:
        assert plot["done"] and plot["w"] >= 700 and plot["h"] >= 150 and plot["shown"] > 300, plot
    assert title.startswith("mlm-pipeline report")
    for words in ("Summary", "Settings", "max-seq-length", "random-next share", "[UNK] rate", "empty_file"):
        assert words in text, words
    from PIL import Image

    with Image.open(shot) as im:
        assert im.width == 1100 and im.height > 3000  # the whole page, seven plots tall
    keep = os.environ.get("MLM_REPORT_SCREENSHOT")  # to look at it: MLM_REPORT_SCREENSHOT=shot.png pytest ...
    if keep:
        shutil.copy(shot, keep)
