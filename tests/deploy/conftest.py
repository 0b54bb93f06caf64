"""Fixtures of the VM-group tests: the stand-in cloud CLIs, the image, the wheel, the local run."""

from __future__ import annotations

import shutil

import pytest

from helpers_run import VOCAB

from .vm_harness import CORPUS, SETTINGS, build_wheel, image_site, install_cloud_cli, make_venv


@pytest.fixture(scope="session")
def cloud_cli(tmp_path_factory):
    """A directory with the stand-in ``gcloud`` and ``aws``."""
    return install_cloud_cli(tmp_path_factory.mktemp("cloud-cli"))


@pytest.fixture(scope="session")
def image(tmp_path_factory):
    """The image's site directory: every dependency of mlm-pipeline, not mlm-pipeline."""
    return image_site(tmp_path_factory.mktemp("image") / "site-packages")


@pytest.fixture(scope="session")
def image_venv(tmp_path_factory):
    """A venv baked into the image (copied into each VM that uses it: saves making one per VM)."""
    return make_venv(tmp_path_factory.mktemp("image-venv") / "venv")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """Where every VM saves the tokenizer: its path is part of the run's settings, so the local
    run below uses the same path (the VMs overwrite it with the same bytes)."""
    d = tmp_path_factory.mktemp("tokenizer")
    shutil.copy(VOCAB, d / "vocab.txt")
    return d


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    for f in CORPUS:
        shutil.copy(f, d / f.name)
    return d


@pytest.fixture(scope="session")
def group_baseline(tmp_path_factory, tokenizer_dir, corpus_dir):
    """A local run of the settings the VMs get."""
    from helpers_run import make_config
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path_factory.mktemp("local-run")
    return run_prepare(make_config([corpus_dir], out, tokenizer=str(tokenizer_dir / "vocab.txt"), **SETTINGS),
                       show_progress=False)
