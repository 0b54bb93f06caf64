"""Google's and ALBERT's ``create_pretraining_data.py`` command lines, as written, to ``prepare``'s flags.

A user of either script keeps their command: ``--max_seq_length=128`` or ``--max_seq_length 128``,
``--do_lower_case[=True|False]`` and absl's ``--nodo_lower_case``, ``--input_file=a.txt,b*.txt``
(a comma list of paths or globs), ALBERT's ``--spm_model_file``, ``--ngram``... Each setting
declares its Google name in :mod:`mlm_pipeline.config`; :func:`native_args` translates before
typer parses. ALBERT's flags without a setting here are dropped when harmless and refused
otherwise (``--do_permutation``).
"""

from __future__ import annotations

import os

import typer

from mlm_pipeline.config import Setting, note_google_spelling


def google_help(settings: tuple[Setting, ...]) -> str:
    """The line of ``prepare --help`` that lists the Google names."""
    flags = [f"--{s.google}" + ("=a.txt,b.txt (comma list, globs)" if s.is_list else "=True" if s.value_type is bool else "")
             for s in settings if s.google]
    return f"Google's create_pretraining_data.py flags work as written: {', '.join(flags)}."


def native_args(args: list[str], settings: tuple[Setting, ...]) -> list[str]:
    """Google's flags as create_pretraining_data.py takes them -> this command's flags:
    ``--max_seq_length=128`` or ``--max_seq_length 128``, ``--do_lower_case[=True|False]`` and
    absl's ``--nodo_lower_case``, ``--input_file=a.txt,b*.txt`` (a comma list of paths or globs)."""
    google = {s.google: s for s in settings if s.google}
    note_google_spelling(None)
    out: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--":
            out += [arg, *rest]
            break
        if _refused_google_flag(arg, rest):
            continue
        s, value = _google_flag(arg, google)
        if s is not None:
            note_google_spelling(s.name)
        if s is None:
            out.append(arg)
        elif s.value_type is bool:
            if value is not None and value.strip().lower() not in _TRUE | _FALSE:
                raise typer.BadParameter(f"{arg}: expected True or False")
            on = value is None or value.strip().lower() in _TRUE
            out.append(s.flags[0] if on else f"--no-{s.flags[0][2:]}")
        else:
            if value is None and (value := next(rest, None)) is None:
                raise typer.BadParameter(f"{arg} needs a value")
            if s.name == "output":
                _google_output(value)
            values = [v for v in value.split(",") if v] if s.is_list else [value]
            out += values if s.positional else [x for v in values for x in (s.flags[0], v)]
    return out


_TRUE, _FALSE = {"true", "t", "1", "yes", "y"}, {"false", "f", "0", "no", "n"}

_SHARD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr", ".record", ".parquet")


def _refused_google_flag(arg: str, rest) -> bool:
    """ALBERT's flags with no setting here: harmless values are dropped (True), others refused.
    ``--do_permutation`` (ALBERT's permuted-token option, off by default) is not implemented;
    ``--input_file_mode`` other than ``r`` (text) changes nothing ALBERT documents."""
    name, eq, value = arg.removeprefix("--").partition("=")
    if not arg.startswith("--"):
        return False
    if name in ("do_permutation", "nodo_permutation"):
        on = name == "do_permutation" and (not eq or value.strip().lower() in _TRUE)
        if on:
            raise typer.BadParameter("--do_permutation, ALBERT's permuted-token targets, is not implemented: leave "
                                     "it out, as ALBERT's default does")
        return True
    if name == "input_file_mode":
        if not eq and (value := next(rest, None)) is None:
            raise typer.BadParameter(f"{arg} needs a value")
        if value.strip() not in ("r", "rb"):
            raise typer.BadParameter(f"--input_file_mode={value}: input files are read as text (ALBERT's default r)")
        return True
    return False


def _google_output(value: str) -> None:
    """Google's ``--output_file`` names files; ours names the output directory of shards. A
    comma list is refused; a name like a file is said to become a directory, with the glob that
    ``run_pretraining.py --input_file`` then takes."""
    if "," in value:
        raise typer.BadParameter(f"--output_file={value}: mlm-pipeline writes one output directory of shards "
                                 "(tasks write their own files in parallel); give one path")
    if value.rstrip("/").lower().endswith(_SHARD_SUFFIXES) and not os.path.isfile(value):  # (a file: refused)
        from mlm_pipeline.run import layout

        shards = f"{value.rstrip('/')}/{layout.SHARDS_DIR}"
        typer.secho(f"note: --output_file {value} is the output directory here: its shards are "
                    f"{shards}/{layout.SHARD_PREFIX}*; give run_pretraining.py --input_file='{shards}/*.tfrecord'",
                    fg=typer.colors.YELLOW, err=True)


def _google_flag(arg: str, google: dict[str, Setting]) -> tuple[Setting | None, str | None]:
    """(setting, value given with ``=``, else None) when ``arg`` is one of Google's flags."""
    if not arg.startswith("--"):
        return None, None
    name, eq, value = arg[2:].partition("=")
    if name in google:
        return google[name], value if eq else None
    negated = google.get(name[2:]) if name.startswith("no") and not eq else None
    if negated is not None and negated.value_type is bool:
        return negated, "false"
    return None, None
