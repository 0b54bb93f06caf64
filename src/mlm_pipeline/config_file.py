"""Config files: a run's settings from YAML or TOML, under any of their names.

Apart from :mod:`mlm_pipeline.config`, which declares the settings: files name them as the
command line does (field name, flag, or Google's name; ``-`` or ``_``), and a key given twice or
a name no setting has is refused, naming the file.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mlm_pipeline.config import PrepareConfig, settings_of
from mlm_pipeline.errors import ConfigError


def config_values(data: dict, model: type[BaseModel] = PrepareConfig, source: str = "config") -> dict:
    """Settings given under any of their names (field, flag or Google name; ``-`` or ``_``)
    -> values keyed by field name. A list setting given as one string by its Google name is a
    comma-separated list, as in Google's ``--input_file=a.txt,b.txt``."""
    by_name = {n: s for s in settings_of(model) for n in s.names()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        spelled = str(key).replace("-", "_")
        s = by_name.get(spelled)
        if s is None:
            close = difflib.get_close_matches(spelled, by_name, n=1)
            hint = f" (did you mean {by_name[close[0]].label}?)" if close else ""
            raise ConfigError(f"unknown setting {key!r} in {source}{hint}")
        if s.name in out:
            raise ConfigError(f"{source} gives {s.label} twice (as {key!r} and another name)")
        if s.is_list and isinstance(value, str):
            value = [v for v in value.split(",") if v] if spelled == s.google else [value]
        out[s.name] = value
    return out


def load_config_file(path: str, model: type[BaseModel] = PrepareConfig) -> dict:
    """Settings from a YAML or TOML file (optionally under a ``prepare`` table), keyed by field name."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}" + (" (it must be UTF-8 text)" if
                                                                       isinstance(exc, UnicodeDecodeError) else "")) from exc
    parse = _toml().loads if p.suffix == ".toml" else _yaml_load
    try:
        data = parse(text)
    except Exception as exc:  # parse errors of either library
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    if "prepare" in data and isinstance(data["prepare"], dict):
        data = data["prepare"]
    return config_values(data, model, source=f"config file {path}")


def _toml():
    """``tomllib`` (Python 3.11+), else the ``tomli`` package it came from (Python 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    return tomllib


def _yaml_load(text: str) -> Any:
    """``yaml.safe_load``, refusing a key given twice in a mapping (YAML would keep the last
    silently; TOML refuses it itself)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, (str, int, float, bool)):
                    continue  # (an unhashable key fails in construct_mapping)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return yaml.load(text, UniqueKeys) or {}


__all__ = ["config_values", "load_config_file"]
