"""mlm-pipeline: raw text to masked-LM pretraining shards.

The Python API (``docs/api.md``)::

    from mlm_pipeline import prepare, PrepareConfig, report_data, MLMDataset, MLMCollator

Every name below is imported on first use, so ``import mlm_pipeline`` stays light: the pipeline
names bring numpy, tokenizers and pyarrow; ``MLMDataset``, ``MLMDataLoader``, ``MLMCollator`` and
``load_prepared`` bring torch (the ``torch`` extra); the plots of ``write_report`` bring
matplotlib (the ``report`` extra). (The table below names modules as strings, and a lazy import
is not an edge of the package's import graph: this facade sits above every layer.)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = {  # name -> the module that defines it
    "prepare": "mlm_pipeline.pipeline",
    "PrepareConfig": "mlm_pipeline.config",
    "build_config": "mlm_pipeline.config",
    "load_config_file": "mlm_pipeline.config_file",
    "finalize": "mlm_pipeline.run.manifest",
    "read_manifest": "mlm_pipeline.run.manifest",
    "read_shard": "mlm_pipeline.inspect",
    "load_tokenizer": "mlm_pipeline.tokenize",
    "report_data": "mlm_pipeline.report",
    "render_report": "mlm_pipeline.report",
    "write_report": "mlm_pipeline.report",
    "PipelineError": "mlm_pipeline.errors",
    "ConfigError": "mlm_pipeline.errors",
    "InputError": "mlm_pipeline.errors",
    "OutputError": "mlm_pipeline.errors",
    "TokenizerError": "mlm_pipeline.errors",
    "IncompleteRun": "mlm_pipeline.errors",
    "TaskFailed": "mlm_pipeline.errors",
    "MLMDataset": "mlm_pipeline.torch",
    "MLMDataLoader": "mlm_pipeline.torch",
    "MLMCollator": "mlm_pipeline.torch",
    "load_prepared": "mlm_pipeline.torch",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'mlm_pipeline' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


if TYPE_CHECKING:  # for type checkers and IDEs; never run
    from mlm_pipeline.config import PrepareConfig, build_config
    from mlm_pipeline.config_file import load_config_file
    from mlm_pipeline.errors import (ConfigError, IncompleteRun, InputError, OutputError, PipelineError, TaskFailed,
                                     TokenizerError)
    from mlm_pipeline.inspect import read_shard
    from mlm_pipeline.pipeline import prepare
    from mlm_pipeline.report import render_report, report_data, write_report
    from mlm_pipeline.run.manifest import finalize, read_manifest
    from mlm_pipeline.tokenize import load_tokenizer
    from mlm_pipeline.torch import MLMCollator, MLMDataLoader, MLMDataset, load_prepared
