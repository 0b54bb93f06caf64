"""Command line: ``mlm-pipeline prepare | inspect | report``.

Flag names follow google-research/bert's ``create_pretraining_data.py`` (with dashes) so a command
line moves over almost unchanged. User errors print one clear message and exit 2; a failed task
exits 1; Ctrl-C exits 130 and the next identical command resumes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from mlm_pipeline import __version__

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Turn raw text corpora into masked-LM pretraining shards (BERT NSP + MLM), "
    "on this machine or on a Ray cluster. Run `mlm-pipeline COMMAND --help` for details.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


class InputFormat(str, Enum):
    auto = "auto"
    text = "text"
    wikiextractor = "wikiextractor"
    jsonl = "jsonl"
    parquet = "parquet"


class OutputFormat(str, Enum):
    tfrecord = "tfrecord"
    parquet = "parquet"


class DecodePolicy(str, Enum):
    replace = "replace"
    skip = "skip"
    fail = "fail"


class Objective(str, Enum):
    nsp = "nsp"
    packed = "packed"
    tokens = "tokens"


class Masking(str, Enum):
    static = "static"
    none = "none"


class Executor(str, Enum):
    local = "local"
    ray = "ray"


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlm-pipeline {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log more detail (per-task timings, resume decisions)."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("mlm_pipeline").setLevel(logging.INFO)


@app.command(no_args_is_help=True)
def prepare(
    ctx: typer.Context,
    inputs: List[str] = typer.Argument(
        ...,
        help="Input files, directories (searched recursively; hidden files ignored) or glob patterns; "
        "local paths or fsspec URLs (s3://bucket/prefix, gs://...). .gz/.bz2/.zst/.xz are decompressed.",
        show_default=False,
    ),
    output: str = typer.Option(
        ..., "--output", "-o",
        help="Output directory or URL. Receives shards/part-TASK-NNNNN.{tfrecord,parquet}, "
        "_tasks/ (completion markers), _run.json and manifest.json. Rerunning the same command into it "
        "resumes; a different configuration is refused.",
        show_default=False,
    ),
    tokenizer: str = typer.Option(
        ..., "--tokenizer", "--vocab-file", "-t",
        help="A WordPiece vocab.txt (Google BERT format), a tokenizer.json, or a local Hugging Face "
        "model directory containing either. Truncation/padding stored in tokenizer.json are ignored.",
        show_default=False,
    ),
    config_file: Optional[Path] = typer.Option(
        None, "--config",
        help="YAML or TOML file with any of these settings (keys as the flag names, dashes or underscores; "
        "optionally under a [prepare] table). Flags given on the command line override it.",
    ),
    do_lower_case: bool = typer.Option(
        True, "--do-lower-case/--no-do-lower-case",
        help="Lower-case and strip accents before WordPiece (match the vocab: True for uncased models). "
        "Only used with a vocab.txt; a tokenizer.json carries its own normaliser.",
    ),
    input_format: InputFormat = typer.Option(
        InputFormat.auto, "--input-format",
        help="text: one sentence per line, blank line between documents (Google's format). "
        "wikiextractor: <doc ...> blocks, one paragraph per line, split into sentences. "
        "jsonl / parquet: one document per record in --text-field, split into sentences. "
        "auto: by extension, else by the first line.",
    ),
    text_field: str = typer.Option("text", "--text-field", help="Field holding the text in JSONL records / Parquet rows."),
    max_seq_length: int = typer.Option(128, "--max-seq-length", help="Tokens per instance including [CLS] and two [SEP]."),
    max_predictions_per_seq: int = typer.Option(20, "--max-predictions-per-seq", help="Most masked positions per instance (the width of masked_lm_* features)."),
    masked_lm_prob: float = typer.Option(0.15, "--masked-lm-prob", help="Share of tokens masked: num_to_predict = min(max_predictions, max(1, round(len(tokens) * prob)))."),
    dupe_factor: int = typer.Option(
        1, "--dupe-factor",
        help="Passes over the data, each with different instance cuts and masks. Default 1 here "
        "(Google's script defaults to 10); raise it for static masking with more variety.",
    ),
    short_seq_prob: float = typer.Option(0.1, "--short-seq-prob", help="Probability that a document's target length is drawn uniformly from [2, max_seq_length-3]."),
    random_seed: int = typer.Option(12345, "--random-seed", help="Global seed; each task derives its own from (seed, task id), so output never depends on worker count."),
    do_whole_word_mask: bool = typer.Option(False, "--do-whole-word-mask/--no-do-whole-word-mask", help="Mask whole words (a token and its ## continuations) together; never part of a word."),
    objective: Objective = typer.Option(
        Objective.nsp, "--objective",
        help="nsp: BERT sentence pairs with next-sentence labels (Google's algorithm). "
        "packed: RoBERTa FULL-SENTENCES, whole sentences packed up to --max-seq-length across document "
        "boundaries ([SEP] between documents), no NSP. tokens: the token stream cut into windows of "
        "--max-seq-length, for masking at load time.",
    ),
    masking: Optional[Masking] = typer.Option(
        None, "--masking",
        help="static: mask now (--masked-lm-prob, 80/10/10, --do-whole-word-mask), as BERT's TFRecords. "
        "none: leave masking to the training loader (mlm_pipeline.torch collator). "
        "Default: static, except none for --objective tokens.",
        show_default=False,
    ),
    reference: bool = typer.Option(
        False, "--reference",
        help="Reproduce create_pretraining_data.py exactly, per input file (same instances, order and masks "
        "for the same flags and seed). One task per file, whole file in memory, slower. See the README.",
    ),
    fmt: OutputFormat = typer.Option(
        OutputFormat.tfrecord, "--format",
        help="tfrecord: tf.train.Example records with the exact features of BERT's run_pretraining.py, padded. "
        "parquet: the same columns unpadded as list<int32> (masked_lm_weights list<float>), zstd-compressed.",
    ),
    workers: int = typer.Option(0, "--workers", "-j", help="Worker processes for the local executor (0 = all cores)."),
    executor: Executor = typer.Option(Executor.local, "--executor", help="local: a process pool on this machine. ray: Ray tasks on a cluster (see --ray-address)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster address: 'auto' on a cluster node, host:6379, or ray://host:10001 (Ray Client). Without it: RAY_ADDRESS (set by `ray job submit`), else a private local Ray instance with --workers CPUs."),
    split_size: str = typer.Option("auto", "--split-size", help="Target input bytes per task: big uncompressed files are cut into ranges of this size on document boundaries; small files are grouped up to it. auto: the total input / 32, from 1MB to 64MB, so a small corpus still spreads over the workers."),
    block_size: str = typer.Option("4MB", "--block-size", help="Text per processing block inside a task: bounds worker memory; random-next segments and the instance shuffle are drawn within a block."),
    max_instances_per_shard: int = typer.Option(100_000, "--max-instances-per-shard", help="A task's output rolls over to a new shard file after this many instances."),
    on_decode_error: DecodePolicy = typer.Option(
        DecodePolicy.replace, "--on-decode-error",
        help="Invalid UTF-8: replace (U+FFFD, document kept, counted), skip (document dropped, counted as invalid_utf8), or fail (stop with the file and offset).",
    ),
    max_line_bytes: str = typer.Option("1MB", "--max-line-bytes", help="Longer lines are not decoded; their document is skipped and counted as line_too_long (memory stays bounded)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="A progress bar on a terminal, periodic log lines otherwise."),
    s3_endpoint_url: Optional[str] = typer.Option(
        None, "--s3-endpoint-url",
        help="Endpoint of an S3-compatible store, e.g. http://minio:9000 (sets AWS_ENDPOINT_URL, also on Ray "
        "workers). Credentials come from the standard AWS chain (environment, ~/.aws, instance role) and are "
        "never logged or written to the output.",
    ),
    task_rank: Optional[int] = typer.Option(
        None, "--task-rank", min=0,
        help="Array mode: this worker's rank in [0, --task-count); it runs the tasks whose index is rank mod "
        "count, skipping completed ones. Default: SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, or "
        "JOB_COMPLETION_INDEX (Kubernetes Indexed Job).",
        show_default=False,
    ),
    task_count: Optional[int] = typer.Option(
        None, "--task-count", min=1,
        help="Array mode: how many workers share the output (default: SLURM_ARRAY_TASK_COUNT; for a Kubernetes "
        "Indexed Job give its completions). The first worker to see every task done writes manifest.json.",
        show_default=False,
    ),
    claim: bool = typer.Option(
        False, "--claim/--no-claim",
        help="Claim mode: any number of identical workers share the output and take tasks through leases in "
        "OUTPUT/_leases/ (conditional writes; a dead worker's task is taken over when its lease expires). "
        "Each worker runs up to --workers tasks at a time and exits when every task is done; the first to see "
        "them all done writes manifest.json. For autoscaling groups / managed instance groups.",
    ),
    lease_seconds: float = typer.Option(
        120.0, "--lease-seconds", min=1.0,
        help="Claim mode: a lease not renewed for this long is taken over (renewed every third of it).",
    ),
) -> None:
    """Prepare masked-LM pretraining shards from raw text.

    Example: mlm-pipeline prepare corpus/ -o out/ -t vocab.txt --max-seq-length 128 --dupe-factor 5

    Scaling out (same bytes as a local run; see docs/cloud.md): --executor ray [--ray-address auto]
    on a Ray cluster or as `ray job submit -- mlm-pipeline prepare ...`; --task-count N for Slurm
    arrays / Kubernetes Indexed Jobs; --claim for any number of identical machines sharing one
    s3:// or gs:// output.
    """
    from mlm_pipeline.config import ConfigError, build_config, load_config_file
    from mlm_pipeline.executors.local import TaskFailed
    from mlm_pipeline.pipeline import OutputError, run_prepare
    from mlm_pipeline.read.base import InputError
    from mlm_pipeline.report import render_summary
    from mlm_pipeline.tokenize import TokenizerError

    if s3_endpoint_url:
        os.environ["AWS_ENDPOINT_URL"] = s3_endpoint_url
    try:
        values = {
            "inputs": list(inputs),
            "output": output,
            "tokenizer": tokenizer,
            "do_lower_case": do_lower_case,
            "input_format": input_format.value,
            "text_field": text_field,
            "max_seq_length": max_seq_length,
            "max_predictions_per_seq": max_predictions_per_seq,
            "masked_lm_prob": masked_lm_prob,
            "dupe_factor": dupe_factor,
            "short_seq_prob": short_seq_prob,
            "random_seed": random_seed,
            "do_whole_word_mask": do_whole_word_mask,
            "objective": objective.value,
            "masking": masking.value if masking else None,
            "reference": reference,
            "format": fmt.value,
            "workers": workers,
            "executor": executor.value,
            "ray_address": ray_address,
            "split_bytes": split_size,
            "block_bytes": block_size,
            "max_instances_per_shard": max_instances_per_shard,
            "on_decode_error": on_decode_error.value,
            "max_line_bytes": max_line_bytes,
            "progress": progress,
        }
        values.update(_scale_out_values(s3_endpoint_url, task_rank, task_count, claim, lease_seconds))
        if config_file is not None:
            # file values fill in every setting not given on the command line
            param_of = {"format": "fmt", "split_bytes": "split_size", "block_bytes": "block_size"}
            for key, value in load_config_file(str(config_file)).items():
                source = ctx.get_parameter_source(param_of.get(key, key))
                if source is None or source.name == "DEFAULT":  # typer vendors its own click
                    values[key] = [value] if key == "inputs" and isinstance(value, str) else value
        config = build_config(values)
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    try:
        manifest = run_prepare(config)
    except (InputError, OutputError, TokenizerError, ConfigError) as exc:
        _fail(str(exc))
    except TaskFailed as exc:
        cause = exc.cause
        if isinstance(cause, (InputError, OutputError)):
            _fail(str(exc))
        _fail(str(exc), code=1)
    except OSError as exc:  # storage unreachable, access denied, ...
        _fail(f"{type(exc).__name__}: {exc}", code=1)
    except KeyboardInterrupt:
        typer.secho(
            "\ninterrupted: completed tasks are kept; run the same command again to resume.",
            fg=typer.colors.YELLOW, err=True,
        )
        raise typer.Exit(130)
    if "worker" in manifest:  # array / claim mode: this worker's part
        manifest = _echo_worker_summary(manifest)
        if manifest is None:
            return
    typer.echo(render_summary(manifest, config.output))


def _scale_out_values(s3_endpoint_url, task_rank, task_count, claim, lease_seconds) -> dict:
    """Settings of the scale-out flags (array rank/count completed from Slurm / Kubernetes)."""
    from mlm_pipeline.executors.array import array_from_env

    rank, count = array_from_env(task_rank, task_count) if not claim else (task_rank, task_count)
    return {"s3_endpoint_url": s3_endpoint_url, "task_rank": rank, "task_count": count, "claim": claim,
            "lease_seconds": lease_seconds}


def _echo_worker_summary(summary: dict) -> dict | None:
    ran = summary["ran"]
    typer.echo(f"{summary['mode']} worker {summary['worker']}: ran {len(ran)} task(s)"
               + (f" ({', '.join(ran[:8])}{' ...' if len(ran) > 8 else ''})" if ran else "")
               + f"; {summary['tasks_done']} of {summary['tasks_total']} tasks done in {summary['output']}")
    if summary["manifest"] is not None:
        typer.echo("this worker completed the run and wrote manifest.json")
        return summary["manifest"]
    if summary["tasks_done"] >= summary["tasks_total"]:
        typer.echo("run complete; manifest.json was written by another worker")
    else:
        typer.echo("other workers' tasks are still running; the last to finish writes manifest.json "
                   "(or run: mlm-pipeline finalize OUTPUT)")
    return None


@app.command(no_args_is_help=True)
def inspect(
    path: str = typer.Argument(..., help="A shard file (.tfrecord or .parquet) or a prepared output directory (its first shard is shown)."),
    n: int = typer.Option(3, "-n", "--num", help="How many instances to show."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="Tokenizer to decode with (default: the one recorded in the output's _run.json)."),
    do_lower_case: Optional[bool] = typer.Option(None, "--do-lower-case/--no-do-lower-case", help="Override the recorded lower-casing (vocab.txt only)."),
    as_json: bool = typer.Option(False, "--json", help="Print instances as JSON lines (ids) instead of decoded text."),
) -> None:
    """Show instances decoded back to text, with [MASK] visible and the masked labels."""
    from mlm_pipeline.inspect import InspectError, inspect_lines

    try:
        for line in inspect_lines(path, n=n, tokenizer=tokenizer, do_lower_case=do_lower_case, as_json=as_json):
            typer.echo(line)
    except (InspectError, OSError, ValueError) as exc:
        _fail(str(exc))


@app.command(no_args_is_help=True)
def report(
    output: str = typer.Argument(..., help="A prepared output directory or URL (reads its manifest.json)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest totals as JSON."),
) -> None:
    """Summarise a prepared output: counts, skips by reason, length and masking histograms."""
    from mlm_pipeline import fs
    from mlm_pipeline.report import render_report

    url = fs.join(output, "manifest.json")
    try:
        manifest = json.loads(fs.read_bytes(url))
    except FileNotFoundError:
        _fail(f"no manifest.json in {output} (is the run complete?)")
    except (OSError, json.JSONDecodeError) as exc:
        _fail(f"cannot read {url}: {exc}")
    if as_json:
        typer.echo(json.dumps(manifest["totals"], indent=1))
    else:
        typer.echo(render_report(manifest))


class TrainMasking(str, Enum):
    auto = "auto"
    static = "static"
    dynamic = "dynamic"


@app.command(no_args_is_help=True)
def train(
    data_dir: str = typer.Argument(..., help="A prepared output directory or URL (with manifest.json): TFRecord or Parquet shards."),
    steps: int = typer.Option(200, "--steps", help="Optimizer steps to run (the data loops over epochs as needed)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Instances per step."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak AdamW learning rate (linear warm-up over 10% of the steps, then linear decay to 10%)."),
    layers: int = typer.Option(2, "--layers", help="Transformer layers."),
    hidden: int = typer.Option(128, "--hidden", help="Hidden size (the feed-forward size is 4x)."),
    heads: int = typer.Option(2, "--heads", help="Attention heads (must divide --hidden)."),
    masking: TrainMasking = typer.Option(
        TrainMasking.auto, "--masking",
        help="static: the masks stored in the shards (BERT's recipe). dynamic: new masks at load time, "
        "15%, 80/10/10, seeded per (seed, epoch, instance). auto: static if the shards are masked, else dynamic.",
    ),
    whole_word_mask: bool = typer.Option(False, "--whole-word-mask/--no-whole-word-mask", help="Dynamic masking of whole words (word boundaries from the tokenizer)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the model initialisation, the data order and the dynamic masks."),
    output_dir: str = typer.Option("train-out", "--output-dir", "-o", help="Receives loss.csv (one row per step), summary.json, checkpoints/ (Lightning, resumable mid-epoch) and model/ (save_pretrained)."),
    num_workers: int = typer.Option(0, "--num-workers", help="DataLoader worker processes (0: load in the training process)."),
    shuffle_buffer: int = typer.Option(10_000, "--shuffle-buffer", help="Instances per shuffle window (also the loader's memory bound per worker)."),
    save_every: int = typer.Option(0, "--save-every", help="Also write checkpoints/step=N.ckpt every N steps (0: only checkpoints/last.ckpt at the end)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="A checkpoint from a previous run: continue its model, optimizer and data position (mid-epoch) up to --steps."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="Tokenizer (default: the one recorded in the manifest)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch intra-op threads (default: torch's choice; 1 on a shared machine)."),
) -> None:
    """Train a tiny BERT (masked LM, plus NSP when the shards have it) on prepared shards, on CPU.

    Needs the torch extra: pip install 'mlm-pipeline[torch]'. The MLM loss is computed at masked
    positions only. Example: mlm-pipeline train out/ --steps 300 --batch-size 32 -o runs/tiny
    """
    try:
        from mlm_pipeline.torch.train import TrainConfig
        from mlm_pipeline.torch.train import main as train_main
    except ImportError as exc:
        _fail(f"training needs the torch extra (pip install 'mlm-pipeline[torch]'): {exc}")
    config = TrainConfig(
        data=data_dir, steps=steps, batch_size=batch_size, lr=lr, layers=layers, hidden=hidden, heads=heads,
        masking=masking.value, whole_word_mask=whole_word_mask, seed=seed, output_dir=output_dir,
        num_workers=num_workers, shuffle_buffer=shuffle_buffer, save_every=save_every, resume=resume,
        tokenizer=tokenizer, threads=threads,
    )
    try:
        summary = train_main(config)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    typer.echo(
        f"{summary['steps_run']} steps in {summary['seconds']:.1f}s; MLM loss on fixed batches "
        f"{summary['eval_mlm_loss_before']:.3f} -> {summary['eval_mlm_loss_after']:.3f}; "
        f"checkpoint in {output_dir}/checkpoints/last.ckpt"
    )


@app.command(no_args_is_help=True)
def finalize(
    output: str = typer.Argument(..., help="A prepared output directory or URL (s3://..., gs://...)."),
    force: bool = typer.Option(False, "--force", help="Rewrite manifest.json even if it exists."),
    s3_endpoint_url: Optional[str] = typer.Option(None, "--s3-endpoint-url", help="Endpoint of an S3-compatible store."),
) -> None:
    """Write manifest.json from the markers of a complete run (array / claim workers do this themselves).

    Needs only the output: the settings and plan are in its _run.json and _plan.json. Exits 1 and
    lists the missing tasks if the run is not complete.
    """
    from mlm_pipeline.finalize import IncompleteRun, finalize as finalize_output
    from mlm_pipeline.report import render_summary

    if s3_endpoint_url:
        os.environ["AWS_ENDPOINT_URL"] = s3_endpoint_url
    try:
        manifest, wrote = finalize_output(output, force=force)
    except IncompleteRun as exc:
        _fail(str(exc), code=1)
    except (OSError, ValueError) as exc:
        _fail(str(exc))
    if not wrote:
        typer.echo("manifest.json already exists (use --force to rewrite it)")
    typer.echo(render_summary(manifest, output))


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # e.g. `mlm-pipeline inspect ... | head`
        sys.stderr.close()


if __name__ == "__main__":
    main()
