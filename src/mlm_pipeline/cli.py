"""Command line: ``mlm-pipeline prepare | inspect | verify | report | finalize | train | vocab``.

``prepare`` is derived from the settings model (:mod:`mlm_pipeline.config`): one flag per field,
with the field's help, choices, default and help panel, so a new setting is one field there.
Its flag names follow google-research/bert's ``create_pretraining_data.py`` (with dashes), and
Google's own spellings (``--max_seq_length=128``, ``--do_lower_case=True``, ``--input_file=a,b``)
work as written. User errors print one clear message and exit 2 (so does a task failed by its
input or tokenizer; another failed task exits 1); Ctrl-C exits 130 (SIGTERM: 143) and the next
identical command resumes. Help text is escaped for rich: ``[torch]`` or ``[CLS]`` show as written.

Why one module: it is the one typer app; its commands share the helpers that give every command
the same help, error lines and exit codes, and each is a thin parse -> call of the API.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys
import time
from inspect import Parameter, Signature, getdoc
from pathlib import Path
from typing import Any, Callable, List, Literal, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from mlm_pipeline import __version__
from mlm_pipeline.cli_google import google_help, native_args
from mlm_pipeline.config import PANELS, PrepareConfig, Setting, build_config, settings_of
from mlm_pipeline.config_file import load_config_file
from mlm_pipeline.errors import (ConfigError, IncompleteRun, InputError, InspectError, OutputError, PipelineError,
                                 TaskFailed, Terminated, TokenizerError, redact_credentials)


_MARKUP_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def escape(markup: str) -> str:
    """Help text escaped for rich, exactly as ``rich.markup.escape`` does (the same pattern and
    rule; tests/test_cli_help.py compares them), without importing rich (~20 ms) in a run that
    shows no help."""
    markup = _MARKUP_TAG.sub(lambda m: f"{m[1]}{m[1]}\\{m[2]}", markup)
    return markup + "\\" if markup.endswith("\\") and not markup.endswith("\\\\") else markup


def _plain(markup: str) -> str:
    """Escaped help text as rich shows it (for the compact help pages)."""
    from rich.text import Text

    return Text.from_markup(markup).plain


class _PlainHelpSwitch:
    """-h/--help shown as a plain switch (no ``<bool>``), as every switch here."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class _Command(_PlainHelpSwitch, TyperCommand):
    """A command whose ``--help`` lists each option on one compact row, the whole flag name shown
    (rich's table cut long names at 80 columns: ``--tokenizer-fla…``), as ``prepare --help`` does."""

    def format_help(self, ctx, formatter):
        from mlm_pipeline.cli_help import print_grouped_help, param_row

        params = [p for p in self.get_params(ctx) if not getattr(p, "hidden", False)]
        print_grouped_help(self.get_usage(ctx), _plain(self.help or ""), [], [],
                           [param_row(ctx, p) for p in params if p.param_type_name == "option"],
                           arguments=[param_row(ctx, p) for p in params if p.param_type_name == "argument"])


class _Group(_PlainHelpSwitch, TyperGroup):
    pass


app = typer.Typer(
    cls=_Group,
    rich_markup_mode="rich",  # help text is escaped (see _command), so panels render and brackets show
    add_completion=False,
    no_args_is_help=True,
    help="Turn raw text corpora into masked-LM pretraining shards (BERT NSP + MLM), "
    "on this machine or on a Ray cluster. Run `mlm-pipeline COMMAND --help` for details.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {redact_credentials(message)}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _command(function: Callable) -> Callable:
    """``app.command`` with the docstring as help, escaped so rich shows ``[torch]`` as written,
    and each paragraph on one line: rich keeps a docstring's line breaks, then wraps again at the
    terminal's width, which left half-empty lines."""
    paragraphs = (getdoc(function) or "").split("\n\n")
    doc = "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)
    return app.command(cls=_Command, no_args_is_help=True, help=escape(doc))(function)


def _stdout_gone() -> None:
    """The reader of stdout went away (``| head``): end quietly with 0, as Unix tools do. stdout
    is pointed at /dev/null so that the interpreter's last flush cannot complain either."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (an embedding host, a test runner)
        pass
    raise typer.Exit(0)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlm-pipeline {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="", help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", metavar="", help="Log more detail (per-task timings, resume decisions)."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("mlm_pipeline").setLevel(logging.INFO)
    # huggingface_hub prints its warnings with a handler of its own; passed on to ours as well,
    # each would be printed twice.
    logging.getLogger("huggingface_hub").propagate = False


# ---- prepare: its flags are built from the settings fields (mlm_pipeline.config) ----------------

PREPARE_HELP = (
    "Prepare masked-LM pretraining shards from raw text.\n\n"
    "Example: mlm-pipeline prepare corpus/ -o out/ -t vocab.txt --max-seq-length 128 --dupe-factor 5\n\n"
    "Scaling out (same bytes as a local run; see docs/cloud.md): --executor ray on a Ray cluster, "
    "--task-count N for Slurm arrays and Kubernetes Indexed Jobs, --claim for any number of identical "
    "machines sharing one s3:// or gs:// output."
)


def _parameter(s: Setting) -> Parameter:
    """A typer parameter for one setting: its flags, type (choices from a Literal), help, panel
    and the model's default (for display; only values the user gave reach the model)."""
    panel = s.panel.capitalize()
    if s.positional:
        info = typer.Argument(None, help=escape(s.help + (" Required." if s.required else "")), metavar=s.metavar,
                              show_default=False)
        return Parameter(s.name, Parameter.KEYWORD_ONLY, default=info, annotation=Optional[List[str]])
    decls = list(s.flags)
    default = None if s.default is ... else s.default
    if s.value_type is bool:
        decls[0] = f"{decls[0]}/--no-{decls[0][2:]}"
        annotation, metavar = bool, ""  # a plain switch: no <bool> value shown
    else:
        annotation = Optional[str if s.text else list[str] if s.is_list else s.value_type]
        metavar = s.metavar
        if s.registry_choices is not None:  # a registry's names, shown as typer shows a Literal's
            metavar = "<" + "|".join(s.choices) + ">"
    info = typer.Option(default, *decls, help=escape(s.help + (" Required." if s.required else "")), metavar=metavar,
                        rich_help_panel=panel,
                        show_default=default is not None)
    return Parameter(s.name, Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


class PrepareCommand(_Command):
    """``prepare``: takes Google's flags as written, translated before parsing."""

    settings_model: type = PrepareConfig

    def format_help(self, ctx, formatter):
        """The settings panel by panel, one compact row each (:mod:`mlm_pipeline.cli_help`)."""
        from mlm_pipeline.cli_help import print_grouped_help

        others = [(", ".join(p.opts) + (f" {p.metavar}" if p.metavar else ""), _plain(p.help or ""))
                  for p in self.get_params(ctx) if p.name not in self.settings_model.model_fields]
        print_grouped_help(self.get_usage(ctx), _plain(self.help or ""),
                           settings_of(self.settings_model), PANELS, others)

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, native_args(list(args), settings_of(self.settings_model)))


def prepare_values(model, given: dict, config_file: Path | None) -> dict:
    """Field values from a config file, overridden by the flags given, scale-out completed
    from the environment (Slurm / Kubernetes array variables)."""
    from mlm_pipeline.executors.array import array_from_env

    values = load_config_file(str(config_file), model) if config_file is not None else {}
    values.update({k: list(v) if isinstance(v, tuple) else v for k, v in given.items()})
    missing = [s for s in settings_of(model) if s.required and s.name not in values
               and not (s.name == "inputs" and values.get("language"))]  # (--language names inputs)
    if missing:
        names = ", ".join((s.metavar or s.name.upper()) if s.positional else "/".join(s.flags) for s in missing)
        raise ConfigError(f"missing {names} (give them on the command line or in --config)")
    # array mode's rank and count default to the scheduler's variables
    if "task_rank" in model.model_fields and not values.get("claim"):
        rank, count = array_from_env(values.get("task_rank"), values.get("task_count"))
        values.update({k: v for k, v in (("task_rank", rank), ("task_count", count)) if v is not None})
    return values


def add_prepare_command(app: typer.Typer, model: type = PrepareConfig,
                        action: Callable[[Any], None] | None = None) -> None:
    """Register ``prepare`` on ``app`` with one flag per field of ``model``, grouped in help
    panels; ``action`` receives the validated settings (default: run the pipeline)."""
    settings = sorted(settings_of(model), key=lambda s: PANELS.index(s.panel))
    action = action or _run_prepare

    def prepare(ctx: typer.Context, config_file: Optional[Path], dry_run: bool, **values) -> None:
        given = {k: v for k, v in values.items() if ctx.get_parameter_source(k).name != "DEFAULT"}
        try:
            config = build_config(prepare_values(model, given, config_file), model)
        except (ConfigError, ValueError) as exc:
            _fail(str(exc))
        _run_prepare(config, dry_run=True) if dry_run else action(config)

    config_option = typer.Option(
        None, "--config", metavar="FILE", show_default=False,
        help=escape("YAML or TOML file of settings, optionally under a [prepare] table; keys: the flag or "
                    "Google's names. Flags given here override it."))
    prepare.__signature__ = Signature([
        Parameter("ctx", Parameter.KEYWORD_ONLY, annotation=typer.Context),
        Parameter("config_file", Parameter.KEYWORD_ONLY, default=config_option, annotation=Optional[Path]),
        Parameter("dry_run", Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(False, "--dry-run", metavar="",
                  help="Check the settings, tokenizer and inputs and print the plan; write nothing.")),
        *(_parameter(s) for s in settings),
    ])
    command_class = type("PrepareCommand", (PrepareCommand,), {"settings_model": model})
    help_text = escape(PREPARE_HELP + "\n\n" + google_help(settings_of(model)))
    app.command("prepare", cls=command_class, help=help_text, no_args_is_help=True)(prepare)


def _run_prepare(config, dry_run: bool = False) -> None:
    """Run the pipeline for ``config`` and print its summary (``dry_run``: its plan); user errors exit 2, a failed task 1."""
    from mlm_pipeline.pipeline import plan_prepare, run_prepare
    from mlm_pipeline.report import render_plan, render_summary

    from mlm_pipeline.environment import configure_process

    configure_process(config.s3_endpoint_url)
    _stop_on_sigterm()
    try:
        started = time.time()
        if dry_run:
            return typer.echo(render_plan(plan_prepare(config), config.output))
        manifest = run_prepare(config)
    except (InputError, OutputError, TokenizerError, ConfigError) as exc:
        _fail(str(exc))
    except TaskFailed as exc:  # (a failure logged as it happened is not printed again)
        message = exc.outcome or str(exc)
        if isinstance(exc.cause, (InputError, OutputError, TokenizerError)):
            _fail(message)
        _fail(message, code=1)
    except OSError as exc:  # storage unreachable, access denied, ...
        _fail(f"{type(exc).__name__}: {exc}", code=1)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        typer.secho(
            f"\n{'terminated (SIGTERM)' if terminated else 'interrupted'}: running tasks stopped, completed tasks "
            "are kept; run the same command again to resume.",
            fg=typer.colors.YELLOW, err=True,
        )
        raise typer.Exit(143 if terminated else 130)
    if "worker" in manifest:  # array / claim mode: this worker's part
        manifest = _echo_worker_summary(manifest)
        if manifest is None:
            return
    # "wrote" when a task ran now (markers record when each started), else what the output holds
    ran_now = any((t.get("started") or 0) >= started for t in manifest.get("task_timings", []))
    typer.echo(render_summary(manifest, config.output, wrote=ran_now))
    if not manifest["totals"].get("documents_read"):  # as when every input is empty: nothing to train on
        raise typer.Exit(2)


def _stop_on_sigterm() -> None:
    """SIGTERM (``kill``, a scheduler's stop, ``docker stop``) stops a run as Ctrl-C does: the
    pool's workers are ended, the completed tasks kept, and the command exits 143."""
    import signal
    import threading

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        raise Terminated()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


add_prepare_command(app)


def _echo_worker_summary(summary: dict) -> dict | None:
    ran = summary["ran"]
    typer.echo(f"{summary['mode']} worker {summary['worker']}: ran {len(ran)} task(s)"
               + (f" ({', '.join(ran[:8])}{' ...' if len(ran) > 8 else ''})" if ran else "")
               + f"; {summary['tasks_done']} of {summary['tasks_total']} tasks done in {summary['output']}")
    if summary["manifest"] is not None:
        typer.echo("this worker completed the run and wrote manifest.json")
        return summary["manifest"]
    if summary.get("manifest_exists"):
        typer.echo("run complete; manifest.json was written by another worker")
    elif summary["tasks_done"] >= summary["tasks_total"]:  # (exit 1: a VM group's script runs prepare again)
        _fail("every task has a marker but manifest.json is not written: a task is being redone, or a marker cannot "
              f"be read; run the same command again, or mlm-pipeline finalize {shlex.quote(summary['output'])}", code=1)
    else:
        typer.echo("other workers' tasks are still running; the last to finish writes manifest.json "
                   "(or run: mlm-pipeline finalize OUTPUT)")
    return None


@_command
def inspect(
    path: str = typer.Argument(..., help="A shard file (.tfrecord or .parquet) or a prepared output directory (its first shard is shown)."),
    n: int = typer.Option(3, "-n", "--num", min=1, help="How many instances to show."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="Tokenizer to decode with (default: the one recorded in the output's _run.json)."),
    do_lower_case: Optional[bool] = typer.Option(None, "--do-lower-case/--no-do-lower-case", metavar="", help="Override the recorded lower-casing (vocab.txt only)."),
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print instances as JSON lines (ids) instead of decoded text."),
) -> None:
    """Show instances decoded back to text, with [MASK] visible and the masked labels."""
    from mlm_pipeline.inspect import SHARD_HEADER, inspect_lines

    try:
        for line in inspect_lines(path, n=n, tokenizer=tokenizer, do_lower_case=do_lower_case, as_json=as_json):
            # with --json, stdout holds JSON lines only (for jq and pandas): each shard's header goes to stderr
            typer.echo(line, err=as_json and line.startswith(SHARD_HEADER))
    except BrokenPipeError:
        _stdout_gone()
    except (InspectError, OSError, ValueError) as exc:
        _fail(str(exc))


@_command
def verify(
    output: str = typer.Argument(..., help="A prepared output directory or URL (s3://..., gs://...)."),
    size_only: bool = typer.Option(False, "--size-only", metavar="", help="Compare sizes only (one metadata request a shard) instead of reading every shard for its SHA-256."),
    repair: bool = typer.Option(False, "--repair", metavar="", help="Mark the tasks of bad shards as not done (delete their markers and manifest.json), so that running the same prepare command again rewrites exactly those shards."),
    s3_endpoint_url: Optional[str] = typer.Option(None, "--s3-endpoint-url", help="Endpoint of an S3-compatible store."),
) -> None:
    """Check every shard against the sizes and SHA-256 its run recorded; name each bad one.

    Reads the manifest (or, before the run is finalized, the task markers). Exits 0 when the run is
    complete and every shard whole, 1 when any is missing, truncated or changed (each listed) or a
    task is not done, 2 when the output holds no run. --repair: the same prepare redoes those tasks.
    """
    from mlm_pipeline.environment import configure_process
    from mlm_pipeline.verify import forget_bad_tasks, verify_output

    configure_process(s3_endpoint_url)
    try:
        result = verify_output(output, check="size" if size_only else "sha256")
    except (InspectError, OSError, ValueError) as exc:
        _fail(str(exc))
    what = "sizes" if size_only else "sizes and SHA-256"
    for p in result.problems:
        typer.echo(f"BAD {p.path}: {p.problem}")
    if result.ok and not result.complete:  # not "ok": the run is not, whatever its shards so far
        _fail(f"the run is not complete: {result.tasks - result.tasks_done} of its {result.tasks} tasks have not "
              f"finished (no marker); the {result.checked} shard(s) of the {result.tasks_done} finished "
              f"({result.bytes_checked:,} bytes) match {result.source} ({what}); run the same prepare command again "
              "to finish it", code=1)
    if result.ok:
        typer.echo(f"ok: {result.checked} shards ({result.bytes_checked:,} bytes) match {result.source} ({what})")
        return
    if repair:
        tasks = forget_bad_tasks(output, result)
        typer.echo(f"repair: {len(tasks)} task(s) marked not done ({', '.join(tasks)}); run the same prepare "
                   "command again to rewrite their shards")
    _fail(f"{len(result.problems)} of {result.checked} shards do not match {result.source}", code=1)


@_command
def report(
    output: str = typer.Argument(..., help="A prepared output directory or URL (reads its manifest.json)."),
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print the report as JSON instead of text: "
                                 "totals, settings, per-task timings, and what the run did not record (not_known)."),
    html_path: Optional[Path] = typer.Option(None, "--html", metavar="FILE", help="Also write a self-contained HTML "
                                             "page with plots (needs the 'report' extra: matplotlib)."),
    png_dir: Optional[Path] = typer.Option(None, "--png", metavar="DIR", help="Also write each plot as DIR/NAME.png "
                                           "(for terminals without a browser; needs the 'report' extra)."),
) -> None:
    """Summarise a prepared output: counts, skips by reason, length and masking histograms; plots on request."""
    from mlm_pipeline import fs
    from mlm_pipeline.report import render_report, report_data, write_report

    from mlm_pipeline.run.layout import manifest_url
    from mlm_pipeline.run.manifest import read_manifest

    url = manifest_url(output)
    if fs.is_local(output) and os.path.isfile(output):
        _fail(f"{output} is a file: report reads an output directory (the one holding manifest.json); "
              f"to look at one shard: mlm-pipeline inspect {shlex.quote(output)}")
    try:
        manifest = read_manifest(output, need=("shards", "totals"))
    except FileNotFoundError:
        if fs.is_local(output) and not os.path.exists(output):
            _fail(f"{output}: no such directory")
        _fail(f"no manifest.json in {output} (is the run complete?)")
    except (InspectError, OutputError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot read {url}: {exc}")
    data = report_data(manifest)
    written = []
    if html_path is not None or png_dir is not None:
        try:
            written = write_report(data, html_path=html_path, png_dir=png_dir, title=f"mlm-pipeline report: {output}")
        except ConfigError as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail(f"cannot write the report: {exc}")
    try:
        if as_json:
            typer.echo(json.dumps(data, indent=1))
            return
        typer.echo(render_report(manifest))
        for path in written:
            typer.echo(f"wrote {path}")
    except BrokenPipeError:
        _stdout_gone()


@_command
def train(
    ctx: typer.Context,
    data_dir: str = typer.Argument(..., help="A prepared output directory or URL (with manifest.json): TFRecord or Parquet shards."),
    steps: int = typer.Option(200, "--steps", help="Optimizer steps to run (the data loops over epochs as needed)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Instances per step."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak AdamW learning rate (linear warm-up over 10% of the steps, then linear decay to 10%)."),
    layers: int = typer.Option(2, "--layers", help="Transformer layers."),
    hidden: int = typer.Option(128, "--hidden", help="Hidden size (the feed-forward size is 4x)."),
    heads: int = typer.Option(2, "--heads", help="Attention heads (must divide --hidden)."),
    model: Literal["auto", "bert", "albert"] = typer.Option("auto", "--model", help="bert: BertForPreTraining (BertForMaskedLM without pair labels). albert: AlbertForPreTraining (masked LM + sentence-order prediction; AlbertForMaskedLM without pair labels). auto: albert for --objective sop shards, else bert."),
    embedding_size: Optional[int] = typer.Option(None, "--embedding-size", help="ALBERT's factorized embedding size (default: a quarter of --hidden, at least 16)."),
    masking: Literal["auto", "static", "dynamic", "electra"] = typer.Option("auto", "--masking",
        help="static: the masks stored in the shards (BERT's recipe). dynamic: new masks at load time, "
        "at the output's --masked-lm-prob, 80/10/10, seeded per (seed, epoch, instance). electra: ELECTRA's load-time masking (15% drawn "
        "with replacement, 85% [MASK], 15% kept). auto: static if the shards are masked, else the objective's "
        "(electra for --objective electra, else dynamic).",),
    whole_word_mask: bool = typer.Option(False, "--whole-word-mask/--no-whole-word-mask", metavar="", help="Dynamic masking of whole words (word boundaries from the tokenizer)."),
    masking_scheme: Optional[str] = typer.Option(None, "--masking-scheme", metavar="token|whole-word|ngram|span", help="Dynamic masking's scheme, with its default parameters (as prepare's --masking-scheme)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the model initialisation, the data order and the dynamic masks."),
    output_dir: str = typer.Option("train-out", "--output-dir", "-o", help="Receives loss.csv (one row per step), summary.json, checkpoints/ (Lightning, resumable mid-epoch) and model/ (save_pretrained)."),
    num_workers: int = typer.Option(0, "--num-workers", help="DataLoader worker processes (0: load in the training process)."),
    shuffle_buffer: int = typer.Option(10_000, "--shuffle-buffer", help="Instances per shuffle window (also the loader's memory bound per worker)."),
    save_every: int = typer.Option(0, "--save-every", help="Also write checkpoints/step=N.ckpt every N steps (0: only checkpoints/last.ckpt at the end)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="A checkpoint from a previous run: continue its model, optimizer, data position (mid-epoch) and random state up to --steps. SIGTERM stops a run after its step, saves checkpoints/step=N.ckpt and prints the command that continues from it (exit 143)."),
    overwrite_output_dir: bool = typer.Option(False, "--overwrite-output-dir", metavar="", help="Replace another run's checkpoints in --output-dir, or those after the step --resume goes back to (without it, such a directory is refused)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="Tokenizer (default: the one recorded in the manifest)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch intra-op threads (default: torch's choice; 1 on a shared machine)."),
) -> None:
    """Train a tiny BERT or ALBERT (masked LM, plus NSP or SOP when the shards have it) on prepared shards, on CPU.

    Needs the torch extra: pip install 'mlm-pipeline[torch]'. The MLM loss is computed at masked
    positions only. Example: mlm-pipeline train out/ --steps 300 --batch-size 32 -o runs/tiny
    """
    try:
        from mlm_pipeline.torch.checkpoint import resume_command
        from mlm_pipeline.torch.train import TrainConfig
        from mlm_pipeline.torch.train import main as train_main
    except ImportError as exc:
        _fail(f"training needs the torch extra (pip install 'mlm-pipeline[torch]'): {exc}")
    config = TrainConfig(
        data=data_dir, steps=steps, batch_size=batch_size, lr=lr, layers=layers, hidden=hidden, heads=heads,
        model=model, embedding_size=embedding_size,
        masking=masking, whole_word_mask=whole_word_mask, masking_scheme=masking_scheme, seed=seed, output_dir=output_dir,
        num_workers=num_workers, shuffle_buffer=shuffle_buffer, save_every=save_every, resume=resume,
        overwrite_output_dir=overwrite_output_dir, tokenizer=tokenizer, threads=threads,
    )
    try:
        summary = train_main(config)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    except Terminated as exc:  # SIGTERM: a checkpoint saved (mlm_pipeline.torch.checkpoint)
        _fail(f"{exc}; continue with:\n  {resume_command(ctx.command.params, ctx.params, exc.checkpoint)}", 143)
    typer.echo(
        f"{summary['steps_run']} steps in {summary['seconds']:.1f}s; MLM loss on fixed batches "
        f"{summary['eval_mlm_loss_before']:.3f} -> {summary['eval_mlm_loss_after']:.3f}; "
        f"checkpoint in {output_dir}/checkpoints/last.ckpt"
    )


@_command
def finalize(
    output: str = typer.Argument(..., help="A prepared output directory or URL (s3://..., gs://...)."),
    force: bool = typer.Option(False, "--force", metavar="", help="Rewrite manifest.json even if it exists."),
    s3_endpoint_url: Optional[str] = typer.Option(None, "--s3-endpoint-url", help="Endpoint of an S3-compatible store."),
) -> None:
    """Write manifest.json from the markers of a complete run (array / claim workers do this themselves).

    Needs only the output: the settings and plan are in its _run.json and _plan.json. Exits 1 and
    lists the missing tasks if the run is not complete.
    """
    from mlm_pipeline.environment import configure_process
    from mlm_pipeline.report import render_summary
    from mlm_pipeline.run.manifest import finalize as finalize_output

    configure_process(s3_endpoint_url)
    try:
        manifest, wrote = finalize_output(output, force=force)
    except IncompleteRun as exc:
        _fail(str(exc), code=1)
    except (OSError, ValueError) as exc:
        _fail(str(exc))
    if not wrote:
        typer.echo("manifest.json already exists; nothing written (use --force to rewrite it)")
    typer.echo(render_summary(manifest, output, wrote=wrote))


@_command
def vocab(
    inputs: List[str] = typer.Argument(..., metavar="INPUT", help="Corpus files, directories or globs (every "
                                       "format, compression and URL that prepare reads)."),
    output: str = typer.Option(..., "--output", "-o", help="tokenizer.json path, or a directory; vocab.txt and "
                               "vocab-report.json are written beside it."),
    vocab_size: int = typer.Option(30522, "--vocab-size", help="Entries in the vocabulary, special tokens included."),
    lowercase: bool = typer.Option(True, "--lowercase/--no-lowercase", metavar="", help="Lower-case (and strip accents) first."),
    flavor: str = typer.Option("bert", "--tokenizer-flavor", metavar="<bert|electra>",
                               help="electra: also delete every Unicode category C* character, as ELECTRA does."),
    character_coverage: float = typer.Option(0.9995, "--character-coverage", help="Share of character occurrences "
                                             "the alphabet must cover (the rarest characters beyond it become [UNK])."),
    min_frequency: int = typer.Option(2, "--min-frequency", help="Merge only pairs seen at least this often."),
    max_words: int = typer.Option(4_000_000, "--max-words", help="Distinct words kept in memory; past it the "
                                  "rarest are pruned (bounds memory on a corpus larger than RAM)."),
    input_format: str = typer.Option("auto", "--input-format", help="As for prepare."),
) -> None:
    """Train a WordPiece vocabulary on a corpus, deterministically: writes tokenizer.json and vocab.txt.

    The alphabet is chosen by character coverage (not a fixed count), so rare scripts keep their
    characters; ties are broken by the token strings, so the same corpus and settings always give
    the same files. prepare takes either file with -t.
    """
    from mlm_pipeline.vocab import VocabSettings, iter_corpus_documents, train_vocab

    try:
        settings = VocabSettings(vocab_size=vocab_size, lowercase=lowercase, flavor=flavor, min_frequency=min_frequency,
                                 character_coverage=character_coverage, max_words=max_words)
        report = train_vocab(iter_corpus_documents(list(inputs), input_format), output, settings)
    except (ConfigError, InputError) as exc:
        _fail(str(exc))
    typer.echo(f"{report.vocab_size} entries ({report.alphabet_size} characters covering "
               f"{report.character_coverage:.4%} of {report.distinct_characters} seen, {report.merges} merges) "
               f"from {report.documents} documents, {report.words_counted} words")
    for path in report.files:
        typer.echo(f"wrote {path}")


def main() -> None:
    try:
        app(standalone_mode=True)
    except BrokenPipeError:  # e.g. `mlm-pipeline report ... | head`, wherever it is raised
        try:
            _stdout_gone()
        except typer.Exit:
            sys.exit(0)
    except Exception as exc:  # a user error no command caught (exit 2); an object store unreachable (botocore's
        from mlm_pipeline.fs import storage_error  # errors are not OSErrors; exit 1)

        message, code = (str(exc), 2) if isinstance(exc, PipelineError) else (storage_error(exc), 1)
        if message is None:
            raise
        typer.secho(f"error: {redact_credentials(message)}", fg=typer.colors.RED, err=True)
        sys.exit(code)


if __name__ == "__main__":
    main()
