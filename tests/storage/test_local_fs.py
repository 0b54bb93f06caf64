"""Local paths through :mod:`mlm_pipeline.fs` without fsspec: the paths, listings and reads of its
local branches are fsspec's, compared here with fsspec's own on real files and links."""

from __future__ import annotations

import os

import pytest

from mlm_pipeline import fs

fsspec = pytest.importorskip("fsspec")


@pytest.mark.parametrize("url", ["a.txt", "./a.txt", ".", "./", "dir/sub/", "dir//x", "/", "/abs/x/",
                                 "file:///abs/y", "file://rel/z", "file:rel", "local:q", "~/corpus.txt",
                                 "~nosuchuser/x", "a:b.txt", "2024-01-01T00:00.txt"])
def test_a_local_path_is_the_one_fsspec_gives(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fs.get_fs(url)[1] == fsspec.core.url_to_fs(url)[1]


def test_chained_and_remote_urls_still_go_to_fsspec():
    filesystem, path = fs.get_fs("memory://bucket/x")
    assert filesystem.protocol == "memory" and path == "/bucket/x"
    for chained in ("simplecache::memory://bucket/x", "simplecache::/tmp/x"):  # (the second looks local)
        assert type(fs.get_fs(chained)[0]).__name__ == "SimpleCacheFileSystem"


@pytest.fixture
def tree(tmp_path):
    """A directory with a file, a sub-directory, links to each, a broken link and an empty file."""
    root = tmp_path / "d"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"hello\n")
    (root / "empty").write_bytes(b"")
    (root / "sub" / "b.txt").write_bytes(b"xyz")
    os.symlink(root / "a.txt", root / "link-to-a")
    os.symlink(root / "sub", root / "link-to-sub")
    os.symlink(root / "gone", root / "broken")
    return root


def test_local_listings_reads_and_tests_are_fsspecs(tree):
    local = fsspec.filesystem("file")
    for url in [str(tree), f"file://{tree}", str(tree / "a.txt"), str(tree / "sub"), str(tree / "link-to-a"),
                str(tree / "link-to-sub"), str(tree / "broken"), str(tree / "nothing")]:
        path = fs.get_fs(url)[1]
        assert fs.exists(url) == local.exists(path), url
        assert fs.isdir(url) == local.isdir(path), url
        expected = ([fs._with_protocol(url, p) for p in local.ls(path, detail=False)] if local.exists(path) else [])
        assert sorted(fs.listdir(url)) == sorted(expected), url
        sizes = ({i["name"].rsplit("/", 1)[-1]: int(i.get("size") or 0)
                  for i in local.ls(path, detail=True) if i.get("type") != "directory"} if local.exists(path) else {})
        assert fs.list_sizes(url) == sizes, url
    sizes = fs.list_sizes(str(tree))  # (links are listed as files, with their target's size)
    assert set(sizes) == {"a.txt", "empty", "link-to-a", "link-to-sub", "broken"}
    assert (sizes["a.txt"], sizes["empty"], sizes["link-to-a"], sizes["broken"]) == (6, 0, 6, 0)
    assert fs.read_bytes(str(tree / "link-to-a")) == local.cat_file(str(tree / "a.txt")) == b"hello\n"
    with fs.open_url(f"file://{tree}/sub/b.txt") as f, fs.open_head(str(tree / "a.txt"), 2) as g:
        assert (f.read(), g.read(2)) == (b"xyz", b"he")
    with pytest.raises(FileNotFoundError):
        fs.open_url(str(tree / "nothing"))


def test_listed_inputs_are_those_fsspec_listed(tree):
    """A file, a directory and a link named as inputs: each file's URL and size."""
    found = fs.list_inputs([str(tree / "a.txt"), str(tree / "sub"), str(tree / "link-to-a")])
    assert found == [(str(tree / "a.txt"), 6), (str(tree / "sub" / "b.txt"), 3)]  # the link is the same file
    with pytest.raises(Exception, match="no input found"):
        fs.list_inputs([str(tree / "broken")])
