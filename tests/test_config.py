"""The settings model is the one home of every setting: names, spellings, files, fingerprint."""

from __future__ import annotations

import sys

import pytest
from pydantic import Field

from mlm_pipeline.config import PANELS, PrepareConfig, build_config, setting, settings_of
from mlm_pipeline.config_file import config_values, load_config_file
from mlm_pipeline.errors import ConfigError

REQUIRED = {"inputs": ["a.txt"], "output": "out", "tokenizer": "vocab.txt"}


def test_every_field_is_a_setting_with_help_and_a_panel():
    settings = settings_of(PrepareConfig)
    assert [s.name for s in settings] == list(PrepareConfig.model_fields)
    for s in settings:
        assert s.panel in PANELS and s.help.endswith("."), s.name
    assert {p for p in PANELS} == {s.panel for s in settings}  # no empty panel


def test_a_plain_field_is_refused():
    class Plain(PrepareConfig):
        hidden: int = Field(default=1)

    with pytest.raises(TypeError, match="Plain.hidden is not declared with setting"):
        settings_of(Plain)


def test_googles_flag_names_are_declared_once():
    google = {s.google: s.name for s in settings_of(PrepareConfig) if s.google}
    assert google == {
        "input_file": "inputs", "output_file": "output", "vocab_file": "tokenizer", "do_lower_case": "do_lower_case",
        "max_seq_length": "max_seq_length", "max_predictions_per_seq": "max_predictions_per_seq",
        "masked_lm_prob": "masked_lm_prob", "random_seed": "random_seed", "dupe_factor": "dupe_factor",
        "short_seq_prob": "short_seq_prob", "do_whole_word_mask": "do_whole_word_mask",
        # ALBERT's create_pretraining_data.py
        "spm_model_file": "spm_model_file", "random_next_sentence": "random_next_sentence", "ngram": "ngram",
        "favor_shorter_ngram": "favor_shorter_ngram",
    }


def test_runtime_settings_stay_out_of_the_fingerprint():
    runtime = {s.name for s in settings_of(PrepareConfig) if s.runtime}
    assert runtime == {"workers", "executor", "ray_address", "progress", "output", "inputs", "s3_endpoint_url",
                       "task_rank", "task_count", "claim", "lease_seconds", "tokenizer_backend", "verify_inputs",
                       "stall_seconds", "language"}  # (--language: its labels are in the plan, by piece)
    base = build_config(REQUIRED)
    assert build_config({**REQUIRED, "workers": 7, "inputs": ["b.txt"], "claim": True}).output_fingerprint() \
        == base.output_fingerprint()
    assert build_config({**REQUIRED, "dupe_factor": 2}).output_fingerprint() != base.output_fingerprint()


def test_sizes_are_written_as_users_type_them():
    config = build_config(REQUIRED)
    assert (config.block_bytes, config.max_line_bytes, config.split_bytes) == (4 << 20, 1 << 20, None)
    assert build_config({**REQUIRED, "split_bytes": "64MiB", "block_bytes": 1024}).split_bytes == 64 << 20


def test_sizes_mean_what_their_unit_says():
    """KB/MB/GB are decimal (what `prepare` prints as MB), KiB/MiB/GiB binary."""
    from mlm_pipeline.config import parse_size

    assert build_config({**REQUIRED, "split_bytes": "64MB"}).split_bytes == 64_000_000
    assert build_config({**REQUIRED, "split_bytes": "64MiB"}).split_bytes == 64 * 2**20
    assert [parse_size(s) for s in ("512KB", "512KiB", "1.5GB", "1GiB", "2 mib", "3M", "10")] == \
        [512_000, 524_288, 1_500_000_000, 2**30, 2 * 2**20, 3_000_000, 10]


def test_config_values_take_every_spelling():
    values = config_values({"input_file": "a.txt,b*.txt", "vocab-file": "v.txt", "output_file": "o",
                            "split_size": "1MB", "block-size": "2MB", "max_seq_length": 64, "format": "parquet"})
    assert values == {"inputs": ["a.txt", "b*.txt"], "tokenizer": "v.txt", "output": "o", "split_bytes": "1MB",
                      "block_bytes": "2MB", "max_seq_length": 64, "format": "parquet"}
    assert config_values({"inputs": "a,b.txt"}) == {"inputs": ["a,b.txt"]}  # a comma list only by Google's name
    with pytest.raises(ConfigError, match=r"unknown setting 'max-seq-lenght' in config \(did you mean max-seq-length"):
        config_values({"max-seq-lenght": 64})


def test_validation_errors_name_the_flag():
    with pytest.raises(ConfigError, match="split-size: not a size: 'lots'"):
        build_config({**REQUIRED, "split_bytes": "lots"})
    with pytest.raises(ConfigError, match="max-seq-length: Input should be less than or equal to 8192"):
        build_config({**REQUIRED, "max_seq_length": 10_000})
    for endless in ("inf", "nan", 1e10):  # (an alarm timer cannot be set that far)
        with pytest.raises(ConfigError, match="stall-seconds: "):
            build_config({**REQUIRED, "stall_seconds": endless})


def test_toml_falls_back_to_tomli_without_tomllib(tmp_path, monkeypatch):
    """Python 3.10 has no ``tomllib``; ``tomli`` (its origin, same API) is then read instead."""
    stdlib_toml = pytest.importorskip("tomllib")
    file = tmp_path / "prep.toml"
    file.write_text('[prepare]\nmax-seq-length = 64\ninput_file = "a.txt,b.txt"\n')
    monkeypatch.setitem(sys.modules, "tomllib", None)  # `import tomllib` fails as on Python 3.10
    with pytest.raises(ModuleNotFoundError):
        import tomllib as _  # noqa: F401
    monkeypatch.setitem(sys.modules, "tomli", stdlib_toml)
    assert load_config_file(str(file)) == {"max_seq_length": 64, "inputs": ["a.txt", "b.txt"]}


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config_file(str(tmp_path / "none.yaml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("max-seq-length = \n")
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config_file(str(bad))
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config_file(str(listing))


def test_config_files_that_are_not_utf8_or_give_a_key_twice_are_refused_naming_the_file(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("max-seq-length: 64\n# café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"cannot read config file {latin}: 'utf-8' codec can't decode byte 0xe9 "
                                          r".*\(it must be UTF-8 text\)"):
        load_config_file(str(latin))
    twice = tmp_path / "twice.yaml"
    twice.write_text("split-size: 1MiB\nmax-seq-length: 64\nsplit-size: 2MiB\n")
    with pytest.raises(ConfigError, match=rf"cannot parse config file {twice}: the key 'split-size' is given twice\n"
                                          r".*line 3, column 1"):
        load_config_file(str(twice))
    nested = tmp_path / "nested.yaml"  # under a prepare table too; the same key in two tables is fine
    nested.write_text("prepare:\n  dupe-factor: 2\n  dupe-factor: 3\nother:\n  dupe-factor: 2\n")
    with pytest.raises(ConfigError, match="the key 'dupe-factor' is given twice"):
        load_config_file(str(nested))
    nested.write_text("prepare:\n  dupe-factor: 2\nother:\n  dupe-factor: 2\n")
    assert load_config_file(str(nested)) == {"dupe_factor": 2}
    toml = tmp_path / "twice.toml"  # TOML refuses it itself
    toml.write_text("dupe-factor = 2\ndupe-factor = 3\n")
    with pytest.raises(ConfigError, match=rf"cannot parse config file {toml}: .*"):
        load_config_file(str(toml))


def test_setting_refuses_an_unknown_panel():
    with pytest.raises(ValueError, match="unknown help panel 'misc'"):
        setting(1, "misc", "A setting in no panel.")


def test_max_line_bytes_has_a_ceiling():
    """Lines are held whole while tokenized: the limit keeps memory bounded, so it has a top."""
    assert build_config({**REQUIRED, "max_line_bytes": "16MiB"}).max_line_bytes == 16 << 20
    with pytest.raises(ConfigError, match="max-line-bytes: Input should be less than or equal to 16777216"):
        build_config({**REQUIRED, "max_line_bytes": "100MB"})


def test_task_and_block_sizes_have_a_floor_and_the_seed_is_not_negative():
    """``--split-size 1`` made 1.1 MB of input 1.1 million tasks, ``--block-size 1`` a document of
    every line, and ``--random-seed -1`` passed here only to fail in every task."""
    assert build_config({**REQUIRED, "split_bytes": "1KiB", "block_bytes": "1KiB", "random_seed": 0}).split_bytes == 1024
    with pytest.raises(ConfigError, match="split-size: Input should be greater than or equal to 1024"):
        build_config({**REQUIRED, "split_bytes": 1})
    with pytest.raises(ConfigError, match="block-size: Input should be greater than or equal to 1024"):
        build_config({**REQUIRED, "block_bytes": "1000B"})
    with pytest.raises(ConfigError, match="random-seed: Input should be greater than or equal to 0"):
        build_config({**REQUIRED, "random_seed": -1})


def test_a_check_of_several_settings_names_the_flags_without_pydantics_words():
    base = {"inputs": ["a.txt"], "output": "o", "tokenizer": "t"}
    with pytest.raises(ConfigError) as err:
        build_config({**base, "task_rank": 5, "task_count": 3})
    assert str(err.value) == ("invalid settings:\n  --task-rank must be given and in [0, 3) with --task-count 3 (got 5; "
                              "a Slurm array needs contiguous ids, such as --array=0-N, not a step)")
    with pytest.raises(ConfigError) as err:
        build_config({**base, "max_predictions_per_seq": 200, "max_seq_length": 64})
    assert str(err.value) == "invalid settings:\n  --max-predictions-per-seq (200) cannot exceed --max-seq-length (64)"


@pytest.mark.parametrize("objective, masking", [("tokens", None), ("packed", "none")])
def test_copies_that_only_masks_could_tell_apart_are_refused(objective, masking):
    """tokens and packed cut the same instances on every pass: unmasked, --dupe-factor 3 would be 3
    identical copies of each. Masked (or one pass), they are allowed."""
    settings = {**REQUIRED, "objective": objective, **({"masking": masking} if masking else {})}
    with pytest.raises(ConfigError, match=f"--dupe-factor 3 with --objective {objective} and --masking none would "
                                          "write 3 identical copies of every instance"):
        build_config({**settings, "dupe_factor": 3})
    assert build_config({**settings, "dupe_factor": 1}).masking == "none"
    assert build_config({**settings, "dupe_factor": 3, "masking": "static"}).dupe_factor == 3
