"""Run settings: one validated object, loadable from YAML/TOML, with a fingerprint.

Only the settings that change output bytes enter ``output_fingerprint`` — not the worker count,
executor or progress display — which is what lets a rerun with ``--workers 8`` resume a run
started with ``--workers 2``, and refuses a rerun whose masking settings changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(value: int | str) -> int:
    """``"64MB"`` -> 67108864. Sizes are binary (1 MB = 2**20 bytes), as in most data tools."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 512KB, 64MB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


Size = Annotated[int, BeforeValidator(parse_size)]


def _parse_size_or_auto(value: int | str | None) -> int | None:
    return None if value is None or (isinstance(value, str) and value.strip().lower() == "auto") else parse_size(value)


SizeOrAuto = Annotated[int | None, BeforeValidator(_parse_size_or_auto)]

InputFormat = Literal["auto", "text", "wikiextractor", "jsonl", "parquet"]
OutputFormat = Literal["tfrecord", "parquet"]
DecodePolicy = Literal["replace", "skip", "fail"]

# Settings that do not influence the produced shards.
RUNTIME_ONLY = frozenset({"workers", "executor", "ray_address", "progress", "output", "inputs"})
# ... and the scale-out settings (where and by whom tasks run), none of which changes a byte
RUNTIME_ONLY = RUNTIME_ONLY | {"s3_endpoint_url", "task_rank", "task_count", "claim", "lease_seconds"}


class ConfigError(ValueError):
    """A setting is invalid; the message says which and why."""


class PrepareConfig(BaseModel):
    """Everything ``mlm-pipeline prepare`` needs; names follow ``create_pretraining_data.py``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: list[str] = Field(min_length=1)
    output: str
    tokenizer: str
    do_lower_case: bool = True
    input_format: InputFormat = "auto"
    text_field: str = "text"
    on_decode_error: DecodePolicy = "replace"
    max_line_bytes: Size = Field(default=1 << 20, ge=1024)

    objective: Literal["nsp", "packed", "tokens"] = "nsp"
    masking: Literal["static", "none"] | None = None  # None: static, but none for "tokens"
    reference: bool = False
    max_seq_length: int = Field(default=128, ge=8, le=8192)
    max_predictions_per_seq: int = Field(default=20, ge=1)
    masked_lm_prob: float = Field(default=0.15, gt=0.0, lt=1.0)
    dupe_factor: int = Field(default=1, ge=1, le=1000)
    short_seq_prob: float = Field(default=0.1, ge=0.0, le=1.0)
    random_seed: int = 12345
    do_whole_word_mask: bool = False

    format: OutputFormat = "tfrecord"
    split_bytes: SizeOrAuto = Field(default=None, ge=1)  # None: auto, see plan.auto_split_bytes
    block_bytes: Size = Field(default=4 << 20, ge=1)
    max_instances_per_shard: int = Field(default=100_000, ge=1)

    workers: int = Field(default=0, ge=0)
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    progress: bool = True

    # scale-out (runtime only): S3-compatible endpoint, array mode (this worker's share of the
    # tasks) and claim mode (workers take tasks through leases in the output)
    s3_endpoint_url: str | None = None
    task_rank: int | None = Field(default=None, ge=0)
    task_count: int | None = Field(default=None, ge=1)
    claim: bool = False
    lease_seconds: float = Field(default=120.0, ge=1.0)

    @model_validator(mode="after")
    def _check_scale_out(self) -> "PrepareConfig":
        if self.task_count is not None and (self.task_rank is None or self.task_rank >= self.task_count):
            raise ValueError(f"task_rank must be given and in [0, task_count) with task_count={self.task_count}"
                             f" (got {self.task_rank})")
        if self.task_rank is not None and self.task_count is None:
            raise ValueError("task_rank needs task_count")
        if self.claim and self.task_count is not None:
            raise ValueError("claim mode and array mode (task_rank/task_count) exclude each other")
        if (self.claim or self.task_count is not None) and self.executor != "local":
            raise ValueError("array and claim modes run tasks with the local executor on each worker")
        return self

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            if data.get("masking") is None:
                data["masking"] = "none" if data.get("objective") == "tokens" else "static"
            tok = data.get("tokenizer")
            if isinstance(tok, str) and "://" not in tok:
                # recorded absolute, so `inspect`/`train` find it from any directory
                data["tokenizer"] = os.path.abspath(tok)
        return data

    @model_validator(mode="after")
    def _check(self) -> "PrepareConfig":
        if self.reference and (self.objective != "nsp" or self.masking != "static"):
            raise ValueError("--reference reproduces Google's NSP data: it needs --objective nsp with static masking")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ValueError(
                f"max_predictions_per_seq ({self.max_predictions_per_seq}) cannot exceed "
                f"max_seq_length ({self.max_seq_length})"
            )
        return self

    def output_settings(self) -> dict:
        """The settings that determine output bytes (for fingerprints and resume checks)."""
        return {k: v for k, v in self.model_dump().items() if k not in RUNTIME_ONLY}

    def output_fingerprint(self) -> str:
        blob = json.dumps(self.output_settings(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def load_config_file(path: str) -> dict:
    """Settings from a YAML or TOML file, keys with ``-`` or ``_`` alike."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # parse errors of either library
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    if "prepare" in data and isinstance(data["prepare"], dict):
        data = data["prepare"]
    out = {}
    for key, value in data.items():
        key = str(key).replace("-", "_")
        out[CONFIG_ALIASES.get(key, key)] = value
    return out


# config-file spellings that match CLI flags rather than field names
CONFIG_ALIASES = {"split_size": "split_bytes", "block_size": "block_bytes", "vocab_file": "tokenizer",
                  "input_file": "inputs", "output_file": "output"}


def build_config(values: dict) -> PrepareConfig:
    try:
        return PrepareConfig(**values)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "config"
            lines.append(f"{loc.replace('_', '-')}: {err['msg']}")
        raise ConfigError("invalid settings:\n  " + "\n  ".join(lines)) from None
