"""`-t bert-base-uncased`: a Hugging Face hub name, loaded from the local HF cache (offline), or
fetched from the hub when the network allows; offline and not cached, a message that says what
to do. The cache is built here from the bundled vocab, in the hub cache's layout; "the hub" is a
local HTTP server answering as the hub's file endpoint does."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import SAMPLE_TEXT, VOCAB

REVISION = "0123456789abcdef0123456789abcdef01234567"
CONFIG = json.dumps({"do_lower_case": True}).encode()


def populate_cache(cache, repo="bert-base-uncased"):
    """The HF hub cache layout: refs/main names a snapshot whose files link to blobs."""
    model = cache / f"models--{repo.replace('/', '--')}"
    (model / "refs").mkdir(parents=True)
    (model / "refs" / "main").write_text(REVISION)
    (model / "blobs").mkdir()
    snapshot = model / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for name, data in (("vocab.txt", VOCAB.read_bytes()), ("tokenizer_config.json", CONFIG)):
        blob = model / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))


def prepare(tmp_path, out, tokenizer, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    full.update({"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_DISABLE_TELEMETRY": "1", **env})
    return subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(SAMPLE_TEXT), "-o", str(out),
                           "-t", tokenizer, "--no-progress", "-j", "1"], capture_output=True, text=True, env=full,
                          cwd=tmp_path, timeout=300)


def shards(out):
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest, [(s["path"], s["sha256"]) for s in manifest["shards"]]


def test_a_hub_name_loads_from_the_local_cache_offline(tmp_path):
    populate_cache(tmp_path / "hub")
    by_name = prepare(tmp_path, tmp_path / "by-name", "bert-base-uncased", HF_HUB_OFFLINE="1")
    assert by_name.returncode == 0, by_name.stderr
    by_path = prepare(tmp_path, tmp_path / "by-path", str(VOCAB), HF_HUB_OFFLINE="1")
    assert by_path.returncode == 0, by_path.stderr
    manifest, table = shards(tmp_path / "by-name")
    assert table and table == shards(tmp_path / "by-path")[1]
    assert manifest["config"]["tokenizer"] == "bert-base-uncased"


def test_offline_and_not_cached_says_how_to_fix_it(tmp_path):
    populate_cache(tmp_path / "hub")  # another model is cached; this one is not
    proc = prepare(tmp_path, tmp_path / "out", "google/electra-small-discriminator", HF_HUB_OFFLINE="1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    message = proc.stderr
    assert "google/electra-small-discriminator" in message and "HF_HUB_OFFLINE" in message
    assert "hf download google/electra-small-discriminator" in message and "vocab.txt" in message
    assert not (tmp_path / "out" / "manifest.json").exists()
    # a relative path that does not exist is still named as a missing path
    missing = prepare(tmp_path, tmp_path / "out2", "tok/vocab.txt", HF_HUB_OFFLINE="1")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


class _Hub(http.server.BaseHTTPRequestHandler):
    """The hub's file endpoint for one repository: /REPO/resolve/REVISION/FILE."""

    files: dict[str, bytes] = {}
    requests: list[str] = []
    warning = "mlm-test; this hub is a test double"  # the hub's X-HF-Warning header, logged by huggingface_hub

    def _answer(self, body: bool) -> None:
        self.requests.append(self.path)
        parts = self.path.split("?")[0].strip("/").split("/resolve/")
        name = parts[1].split("/", 1)[1] if len(parts) == 2 and "/" in parts[1] else None
        data = self.files.get(name) if parts[0] == "bert-base-uncased" else None
        if data is None:
            self.send_response(404)
            self.send_header("X-HF-Warning", self.warning)
            self.send_header("X-Error-Code", "EntryNotFound" if parts[0] == "bert-base-uncased" else "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-HF-Warning", self.warning)
        self.send_header("X-Repo-Commit", REVISION)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self):  # noqa: N802 - http.server's names
        self._answer(False)

    def do_GET(self):  # noqa: N802
        self._answer(True)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    _Hub.files = {"vocab.txt": VOCAB.read_bytes(), "tokenizer_config.json": CONFIG}
    _Hub.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_hub_name_is_downloaded_when_the_network_allows(tmp_path, hub):
    proc = prepare(tmp_path, tmp_path / "out", "bert-base-uncased", HF_ENDPOINT=hub)
    assert proc.returncode == 0, proc.stderr
    assert any(r.endswith("/vocab.txt") for r in _Hub.requests)
    cached = tmp_path / "hub" / "models--bert-base-uncased" / "snapshots" / REVISION / "vocab.txt"
    assert cached.read_bytes() == VOCAB.read_bytes()
    # huggingface_hub's warnings are printed by its own handler, not a second time by the CLI's
    assert proc.stderr.count("this hub is a test double") == 1, proc.stderr
    # then offline, from what was downloaded: the same shards
    again = prepare(tmp_path, tmp_path / "offline", "bert-base-uncased", HF_HUB_OFFLINE="1")
    assert again.returncode == 0, again.stderr
    assert shards(tmp_path / "out")[1] == shards(tmp_path / "offline")[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Down(http.server.BaseHTTPRequestHandler):
    """A hub that is down: every request answered 503."""

    def do_HEAD(self):  # noqa: N802
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


@pytest.fixture
def down_hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Down)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent_hub():
    """A hub that takes the connection and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("endpoint", ["closed", "down_hub", "silent_hub"])
def test_an_unreachable_hub_is_refused_in_seconds(tmp_path, request, endpoint):
    """No network, HF_HUB_OFFLINE unset, nothing cached: one quick try, not five retries a file
    (which took about 70 s), and each line of stderr printed once."""
    url = f"http://127.0.0.1:{closed_port()}" if endpoint == "closed" else request.getfixturevalue(endpoint)
    env = {"HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf-home")}
    # a hub name, and (once) a mistyped local directory
    for name in ("bert-base-uncased", "tok") if endpoint == "closed" else ("bert-base-uncased",):
        start = time.monotonic()
        proc = prepare(tmp_path, tmp_path / "out", name, **env)
        took = time.monotonic() - start
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert took < 15, (took, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == len(set(lines)) and "Retrying" not in proc.stderr, proc.stderr
        message = proc.stderr
        assert f"tokenizer {name!r}" in message and f"hub ({url}) could not be reached" in message
        assert "no such local file or directory" in message and str(tmp_path / name) in message
        assert f"hf download {name} tokenizer.json vocab.txt" in message and "HF_HUB_OFFLINE" not in message
        assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_unreachable_hub_still_finds_the_cached_files(tmp_path):
    populate_cache(tmp_path / "hub")
    start = time.monotonic()
    proc = prepare(tmp_path, tmp_path / "out", "bert-base-uncased",
                   HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf-home"))
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 15
    by_path = prepare(tmp_path, tmp_path / "by-path", str(VOCAB), HF_HUB_OFFLINE="1")
    assert shards(tmp_path / "out")[1] == shards(tmp_path / "by-path")[1]
