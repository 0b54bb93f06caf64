"""Run settings: one validated object, loadable from YAML/TOML, with a fingerprint.

This is the one home of every ``prepare`` setting. A field declared with :func:`setting` carries
what the command line and config files need: its help, its help panel, its flag spellings when
they differ from the field name, and its name in Google's ``create_pretraining_data.py``. The CLI
(:mod:`mlm_pipeline.cli`) builds its flags from these fields, and config files
(:mod:`mlm_pipeline.config_file`) take the same names, so a new setting is one field here.

Only the settings that change output bytes enter ``output_fingerprint`` — not the worker count,
executor or progress display (fields marked ``runtime=True``) — which is what lets a rerun with
``--workers 8`` resume a run started with ``--workers 2``, and refuses a rerun whose masking
settings changed.

Why one module: it declares every setting and the checks that tie settings together (a masking
scheme's parameters, Google's spellings); a setting split from its checks would be added in two
places. Config files, which only read settings by name, live in :mod:`mlm_pipeline.config_file`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
import re
import types
import typing
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticUndefined

from mlm_pipeline.errors import ConfigError, url_credentials_message

# one convention: SI prefixes are decimal (1 MB = 10**6 bytes, what `prepare` prints), IEC ones
# binary (1 MiB = 2**20 bytes); a bare prefix (64M) is the SI one
_UNITS = {"": 1, "b": 1,
          **{f"{p}{b}": 1000 ** (i + 1) for i, p in enumerate("kmgt") for b in ("", "b")},
          **{f"{p}i{b}": 1 << (10 * (i + 1)) for i, p in enumerate("kmgt") for b in ("", "b")}}


def parse_size(value: int | str) -> int:
    """``"64MB"`` -> 64,000,000 and ``"64MiB"`` -> 67,108,864: KB/MB/GB/TB are decimal, KiB/MiB/GiB/TiB
    binary, as their names say (case is ignored; a bare ``M`` is ``MB``)."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 512KB, 64MB, 64MiB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


Size = Annotated[int, BeforeValidator(parse_size)]

MAX_LINE_BYTES_CEILING = 16 << 20
"""The largest ``--max-line-bytes``: a line is held whole while read (and tokenized in pieces,
``tokenize/long_texts.py``), a few times its size."""


MIN_SPLIT_BYTES = 1024
"""The smallest ``--split-size``: smaller tasks cost more to track than to run (``plan.MAX_TASKS``
bounds their number too)."""
MIN_BLOCK_BYTES = 1024
"""The smallest ``--block-size``: a longer document is cut into parts of this size at line ends
(``--block-size 1`` made every line a document)."""


def _parse_size_or_auto(value: int | str | None) -> int | None:
    return None if value is None or (isinstance(value, str) and value.strip().lower() == "auto") else parse_size(value)


SizeOrAuto = Annotated[int | None, BeforeValidator(_parse_size_or_auto)]

# help panels of `prepare --help`, in the order they are shown
PANELS = ("input", "tokenizer", "instances", "masking", "output", "execution", "cloud")


def setting(default: Any, panel: str, help: str, *, flags: tuple[str, ...] = (), google: str | None = None,
            positional: bool = False, metavar: str | None = None, runtime: bool = False,
            by_content: bool = False, choices: Callable[[], list[str]] | None = None, **constraints: Any) -> Any:
    """A settings field with what the command line and config files need to offer it.

    ``default``: ``...`` when required; sizes are written as a user types them ("4MiB").
    ``panel``: one of :data:`PANELS`. ``flags``: command-line spellings when they are not just
    ``--field-name`` (the first one is the main one). ``google``: the flag's name in Google's
    ``create_pretraining_data.py``, accepted as written there (``--max_seq_length=128``).
    ``positional``: given as the command's arguments. ``runtime``: does not change output bytes.
    ``by_content``: a path whose file content is fingerprinted elsewhere (the tokenizer's): it is
    recorded, but where it lies enters neither the output fingerprint nor the resume check.
    ``choices``: for a plain ``str`` setting whose values come from a registry (input and output
    formats, objectives, tokenizer backends), a function listing them (asked when help is shown).
    ``constraints``: pydantic's (``ge``, ``le``, ``min_length``, ...).
    """
    if panel not in PANELS:
        raise ValueError(f"unknown help panel {panel!r}; one of {', '.join(PANELS)}")
    extra = {"panel": panel, "flags": list(flags), "google": google, "positional": positional,
             "metavar": metavar, "runtime": runtime, "by_content": by_content, "choices": choices}
    return Field(default, description=help, json_schema_extra=extra, **constraints)


def _input_format_choices() -> list[str]:
    from mlm_pipeline.read import input_format_names  # the registry of input formats (read/)

    return ["auto", *input_format_names()]


def _output_format_choices() -> list[str]:
    from mlm_pipeline.formats import output_format_names  # imports no format module

    return list(output_format_names())


def _tokenizer_backend_choices() -> list[str]:
    from mlm_pipeline.tokenize.backends import backend_names

    return backend_names()


def _objective_choices() -> list[str]:
    from mlm_pipeline.instances import objective_names  # the registry of objectives (instances/)

    return list(objective_names())


def _masking_scheme_choices() -> list[str]:
    from mlm_pipeline.masking import masking_scheme_names  # the registry of masking schemes (masking/)

    return list(masking_scheme_names())


def _one_of(choices: Callable[[], list[str]], what: str) -> AfterValidator:
    """Validation against a registry, so that registering a plug-in is all a new choice takes."""

    def check(name: str) -> str:
        known = choices()
        if name not in known:
            raise ValueError(f"unknown {what} {name!r}; known: {', '.join(known)}")
        return name

    return AfterValidator(check)


InputFormat = Annotated[str, _one_of(_input_format_choices, "input format")]
OutputFormatName = Annotated[str, _one_of(_output_format_choices, "output format")]
TokenizerBackend = Annotated[str, _one_of(_tokenizer_backend_choices, "tokenizer backend")]
ObjectiveName = Annotated[str, _one_of(_objective_choices, "objective")]
MaskingSchemeName = Annotated[str, _one_of(_masking_scheme_choices, "masking scheme")]
DecodePolicy = Literal["replace", "skip", "fail"]


def _namespace_list(value: int | str | list) -> str:
    """``" 0, 14,0"`` (or ``0``, or ``[0, 14]`` in a config file) -> ``"0,14"``: integers,
    sorted, each once, so that one choice has one spelling (and one output fingerprint)."""
    items = value if isinstance(value, list) else str(value).split(",")
    try:
        numbers = sorted({int(str(n).strip()) for n in items if str(n).strip()})
    except ValueError:
        raise ValueError(f"not a comma-separated list of namespace numbers: {value!r} (e.g. 0 or 0,14)") from None
    if not numbers:
        raise ValueError("at least one namespace number is needed (0: articles)")
    return ",".join(map(str, numbers))


WikiNamespaces = Annotated[str, BeforeValidator(_namespace_list)]


class PrepareConfig(BaseModel):
    """Everything ``mlm-pipeline prepare`` needs; names follow ``create_pretraining_data.py``."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    inputs: list[str] = setting(
        ..., "input", "Files, directories (searched recursively) or globs; local paths or s3://, gs:// URLs. "
        ".gz .bz2 .zst .xz are decompressed.",
        positional=True, google="input_file", metavar="INPUT", runtime=True, min_length=1)
    output: str = setting(
        ..., "output", "Output directory or URL. The same command again resumes; other settings are refused.",
        flags=("--output", "-o"), google="output_file", runtime=True)
    tokenizer: str = setting(
        ..., "tokenizer", "A WordPiece vocab.txt, a tokenizer.json, a SentencePiece .model, a model directory, or a "
        "Hugging Face hub name (bert-base-uncased: from the local HF cache, or downloaded).",
        flags=("--tokenizer", "--vocab-file", "-t"), google="vocab_file", by_content=True)
    spm_model_file: str | None = setting(
        None, "tokenizer", "ALBERT's SentencePiece .model, in place of --tokenizer.",
        google="spm_model_file", metavar="PATH", by_content=True)
    tokenizer_backend: TokenizerBackend = setting(
        "auto", "tokenizer", "Encoder: auto, the fastest one that gives the reference's ids exactly (checked), "
        "or one by name. Output never depends on it.",
        runtime=True, choices=_tokenizer_backend_choices)
    tokenizer_flavor: Literal["bert", "electra", "auto"] = setting(
        "auto", "tokenizer", "Text rules of a WordPiece vocab: bert (HF's), electra (drops Unicode C* characters, "
        "strips accents only when lower-casing). auto: electra for --objective electra, else bert.")
    do_lower_case: bool = setting(
        True, "tokenizer", "Lower-case and strip accents (vocab.txt, ALBERT's .model; match the vocab).",
        google="do_lower_case")
    verify_inputs: bool = setting(
        False, "input", "On resume, check the bytes each completed task read by SHA-256 (every input read once "
        "more at start). Without it: a file's size and 8 sampled 4 KB blocks per task, an object's ETag or "
        "generation.",
        runtime=True)
    input_format: InputFormat = setting(
        "auto", "input", "text: Google's (a sentence per line, a blank line between documents). wikiextractor, "
        "jsonl, parquet: paragraphs, split into sentences. wikidump, wikitext (wiki.train.tokens): an article "
        "per document. "
        "auto: by name, else by the first bytes.",
        choices=_input_format_choices)
    text_field: str = setting("text", "input", "Field holding the text in JSONL records and Parquet rows.")
    language: list[str] = setting(
        [], "input", "Input PATH is in language CODE; once per language (*=PATH: a directory "
        "per language, PATH/en/...).", metavar="CODE=PATH", runtime=True)
    language_field: str | None = setting(
        None, "input", "JSONL/Parquet field naming each record's language.", metavar="FIELD")
    id_field: str | None = setting(
        None, "input", "JSONL/Parquet record id field, kept per instance (parquet, mds, hf).", metavar="FIELD")
    metadata_field: str | None = setting(
        None, "input", "JSONL/Parquet metadata field(s) a,b, kept per instance as JSON.", metavar="FIELD")
    language_detect: bool = setting(
        False, "input", "Documents without a language: detect it (fastText lid.176; the langid extra).")
    language_alpha: float | None = setting(
        None, "instances", "Sample languages by q_i ∝ p_i^α of their tokens (XLM-R: 0.3).", metavar="α", gt=0.0, le=1.0)
    sentence_split: bool = setting(
        False, "input", "text input: split each line into sentences with the BlingFire segmenter, for a paragraph "
        "per line (WikiText, web text); a blank line still ends a document.")
    on_decode_error: DecodePolicy = setting(
        "replace", "input", "Invalid UTF-8: replace with U+FFFD or skip the document (both counted), or fail.")
    max_line_bytes: Size = setting(
        "1MiB", "input", "A longer line is not decoded; its document is skipped and counted. At most 16MiB: "
        "such a line is held whole in memory, so this bounds a worker's memory.",
        metavar="SIZE", ge=1024, le=MAX_LINE_BYTES_CEILING)
    wiki_index: str | None = setting(
        None, "input", "Wikipedia dump: its multistream index (default: the one beside the dump, if any).",
        metavar="PATH")
    wiki_namespaces: WikiNamespaces = setting(
        "0", "input", "Wikipedia dump: the namespace numbers read, comma-separated (0: articles).",
        metavar="N,N")
    wiki_keep_headings: bool = setting(
        False, "input", "Wikipedia dump: keep section headings, as paragraphs of their own.")
    wiki_keep_tables: bool = setting(
        False, "input", "Wikipedia dump: keep table captions and cell text.")
    wiki_keep_references: bool = setting(False, "input", "Wikipedia dump: keep reference sections and citations.")

    objective: ObjectiveName = setting(
        "nsp", "instances", "nsp: BERT pairs with next-sentence labels. sop: ALBERT's sentence order. "
        "packed: RoBERTa full sentences. tokens: fixed windows. electra: ELECTRA's examples, "
        "masked in training. sentences, documents: tokens for megatron.",
        choices=_objective_choices)
    masking: Literal["static", "none"] | None = setting(
        None, "masking", "static: mask now, as BERT's TFRecords. none: the training loader masks. "
        "Default: the objective's (none for tokens and electra, else static).")
    reference: bool = setting(
        False, "instances", "Reproduce the objective's reference script exactly (Google's "
        "create_pretraining_data.py, ALBERT's, ELECTRA's build_pretraining_dataset.py). Slower.")
    max_seq_length: int = setting(
        128, "instances", "Tokens per instance, [CLS] and [SEP] included.", google="max_seq_length", ge=8, le=8192)
    max_predictions_per_seq: int = setting(
        20, "masking", "Most masked positions per instance.", google="max_predictions_per_seq", ge=1)
    masked_lm_prob: float = setting(
        0.15, "masking", "Share of tokens masked (80% [MASK], 10% random, 10% kept).",
        google="masked_lm_prob", gt=0.0, lt=1.0)
    dupe_factor: int = setting(
        1, "instances", "Passes over the data, each with new cuts and masks (Google's default is 10).",
        google="dupe_factor", ge=1, le=1000)
    short_seq_prob: float = setting(
        0.1, "instances", "Probability of a shorter target length, drawn from [2, max-seq-length - 3].",
        google="short_seq_prob", ge=0.0, le=1.0)
    random_seed: int = setting(
        12345, "instances", "Global seed; each task derives its own, so output never depends on the worker count.",
        google="random_seed", ge=0)
    masking_scheme: MaskingSchemeName | None = setting(
        None, "masking", "token: BERT's. whole-word: words whole. ngram: ALBERT's n-grams of words. span: SpanBERT's "
        "spans of words. Default: the objective's (token).", choices=_masking_scheme_choices)
    do_whole_word_mask: bool | None = setting(
        None, "masking", "Words whole: --masking-scheme whole-word; with ngram (its default), n-grams of words.",
        google="do_whole_word_mask")
    ngram: int = setting(3, "masking", "ngram: the longest n-gram, in words.", google="ngram", ge=1, le=64)
    favor_shorter_ngram: bool = setting(
        True, "masking", "ngram: P(n) ∝ 1/n; off: reversed (as ALBERT).", google="favor_shorter_ngram")
    geometric_p: float = setting(0.2, "masking", "span: p of the geometric span length.", gt=0.0, le=1.0)
    span_lower: int = setting(1, "masking", "span: the shortest span, in words.", ge=1, le=512)
    span_upper: int = setting(10, "masking", "span: the longest span, in words.", ge=1, le=512)
    random_next_sentence: bool = setting(
        False, "instances", "sop: B from another document half the time (ALBERT's NSP), not swapped.",
        google="random_next_sentence")
    packing: Literal["sentences", "best-fit"] = setting(
        "sentences", "instances", "packed: sentences (RoBERTa's) or best-fit (whole documents, least padding).")
    cross_document: bool = setting(
        True, "instances", "packed: rows may span documents (FULL-SENTENCES); off: never (DOC-SENTENCES).")

    format: OutputFormatName = setting(
        "tfrecord", "output", "tfrecord: for BERT's run_pretraining.py. parquet: the same columns, "
        "unpadded, zstd. mds: mosaicml-streaming's (Composer). hf: for datasets.load_from_disk. "
        "megatron: .bin/.idx of tokens, not instances.", choices=_output_format_choices)
    mds_compression: Literal["none", "zstd"] = setting(
        "none", "output", "zstd: compressed MDS shards (not for NoStreamingDataset).")
    split_bytes: SizeOrAuto = setting(
        "auto", "execution", "Input bytes per task (64MB = 64*10^6 bytes, 64MiB = 64*2^20). auto: the total input / 256, "
        "from 4MiB to 64MiB (several tasks per worker keep a pool busy to the end).",
        flags=("--split-size",), metavar="SIZE", ge=MIN_SPLIT_BYTES)
    block_bytes: Size = setting(
        "4MiB", "execution", "Text per task block (and per part of a longer document); bounds worker memory.",
        flags=("--block-size",), metavar="SIZE", ge=MIN_BLOCK_BYTES)
    num_out_files: int | None = setting(
        None, "output", "Write N files as ELECTRA names them (pretrain_tfrecords/pretrain_data.tfrecord-I-of-N, "
        "examples round-robin) instead of part-* shards. Default: 1000 for --objective electra --reference.",
        ge=1)
    max_instances_per_shard: int = setting(
        100_000, "output", "A task starts a new shard file after this many instances.", ge=1)

    workers: int = setting(0, "execution", "Worker processes (0: all cores).", flags=("--workers", "-j"),
                           runtime=True, ge=0)
    executor: Literal["local", "ray"] = setting(
        "local", "execution", "local: a process pool on this machine. ray: Ray tasks on a cluster.", runtime=True)
    ray_address: str | None = setting(
        None, "execution", "auto (a cluster node), host:6379 or ray://host:10001. "
        "Default: RAY_ADDRESS, else a local Ray.", runtime=True)
    progress: bool = setting(True, "execution", "A progress bar on a terminal, log lines otherwise.", runtime=True)
    stall_seconds: float = setting(
        600.0, "execution", "A task silent this long is hung: its worker is ended and it runs "
        "again (3 tries). 0: off.", runtime=True, ge=0, le=10_000_000)

    # scale-out: S3-compatible endpoint, array mode (this worker's share of the tasks) and claim
    # mode (workers take tasks through leases in the output)
    s3_endpoint_url: str | None = setting(
        None, "cloud", "S3-compatible endpoint, e.g. http://minio:9000 (credentials: the AWS chain, never "
        "logged).", runtime=True)
    task_rank: int | None = setting(
        None, "cloud", "Array mode: this worker's rank in [0, task-count). "
        "Default: from SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX.", runtime=True, ge=0)
    task_count: int | None = setting(
        None, "cloud", "Array mode: how many workers share the output. Default: SLURM_ARRAY_TASK_COUNT.",
        runtime=True, ge=1)
    claim: bool = setting(
        False, "cloud", "Claim mode: any number of identical workers take tasks through leases in the output.",
        runtime=True)
    lease_seconds: float = setting(
        120.0, "cloud", "Claim mode: a lease not renewed for this long is taken over.", runtime=True, ge=1.0)

    @model_validator(mode="after")
    def _check_scale_out(self) -> "PrepareConfig":
        if self.task_count is not None and (self.task_rank is None or self.task_rank >= self.task_count):
            raise ValueError(f"--task-rank must be given and in [0, {self.task_count}) with --task-count "
                             f"{self.task_count} (got {self.task_rank}; a Slurm array needs contiguous ids, such "
                             "as --array=0-N, not a step)")
        if self.task_rank is not None and self.task_count is None:
            raise ValueError("--task-rank needs --task-count")
        if self.claim and self.task_count is not None:
            raise ValueError("--claim and --task-rank/--task-count (array mode) exclude each other")
        if self.claim and self.executor != "local":
            raise ValueError("--claim runs tasks on each worker's own process pool: not with --executor ray")
        return self

    @model_validator(mode="after")
    def _check_no_credentials(self) -> "PrepareConfig":
        """A URL holding a password would be echoed and recorded: refused, quoted redacted."""
        for s in settings_of(type(self)):
            value = getattr(self, s.name)
            for item in value if isinstance(value, list) else [value]:
                refused = url_credentials_message(item) if isinstance(item, str) else None
                if refused is not None:
                    raise ValueError(f"{'INPUT' if s.positional else s.flags[0]}: {refused}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            if data.get("masking") is None:
                from mlm_pipeline.instances import get_objective, objective_names

                name = data.get("objective", "nsp")  # an unknown name fails on the field
                data["masking"] = get_objective(name).default_masking if name in objective_names() else "static"
            _resolve_masking_scheme(data)
            if data.get("tokenizer_flavor") in (None, "auto"):
                from mlm_pipeline.instances import get_objective, objective_names

                name = data.get("objective", "nsp")
                # recorded resolved, so the fingerprint and every reader see the effective flavor
                data["tokenizer_flavor"] = get_objective(name).tokenizer_flavor if name in objective_names() else "bert"
            if data.get("num_out_files") is None and data.get("reference") is True:
                name = data.get("objective", "nsp")
                ref = get_objective(name).reference if name in objective_names() else None
                if ref is not None:
                    data["num_out_files"] = ref.num_out_files  # e.g. ELECTRA's fixed 1000 files
            if data.get("spm_model_file"):  # ALBERT's: the SentencePiece model is the tokenizer
                data["tokenizer"] = data["spm_model_file"]
                if "://" not in data["spm_model_file"]:
                    data["spm_model_file"] = os.path.abspath(data["spm_model_file"])
            if data.get("language"):  # the labelled paths are inputs too
                inputs = list(data.get("inputs") or [])
                for entry in data["language"]:
                    path = str(entry).partition("=")[2]
                    if path and path not in inputs:
                        inputs.append(path)
                data["inputs"] = inputs
            tok = data.get("tokenizer")
            if isinstance(tok, str) and "://" not in tok and not _hub_name(tok):
                # recorded absolute, so `inspect`/`train` find it from any directory
                data["tokenizer"] = os.path.abspath(tok)
        return data

    @model_validator(mode="after")
    def _check(self) -> "PrepareConfig":
        if self.reference:
            from mlm_pipeline.instances import get_objective

            ref = get_objective(self.objective).reference
            if ref is None or self.masking != ref.masking:
                raise ValueError(f"--reference: objective {self.objective} has no reference mode" if ref is None
                                 else f"--reference ({ref.help}) needs --masking {ref.masking}")
            if self.masking_scheme not in ref.masking_schemes:
                raise ValueError(f"--reference ({ref.help}) masks as its script does: --masking-scheme "
                                 f"{' or '.join(ref.masking_schemes)}, not {self.masking_scheme}")
            if self.sentence_split:
                raise ValueError("--reference reads each line as a sentence, as its reference script does: "
                                 "--sentence-split does not apply (leave it out, or split the text beforehand)")
            if self.input_format not in ("auto", "text"):
                raise ValueError(f"--reference reads plain text line by line, as its reference script does: "
                                 f"--input-format {self.input_format} does not apply")
        if self.num_out_files is not None and self.format != "tfrecord":
            how = f" (--reference writes them as its script does, {self.num_out_files} files)" if self.reference else ""
            raise ValueError(f"--num-out-files writes ELECTRA's TFRecord files{how}; it needs --format tfrecord, "
                             f"not {self.format}")
        if self.mds_compression != "none" and self.format != "mds":
            raise ValueError(f"--mds-compression compresses MDS shards; it needs --format mds, not {self.format}")
        _check_masking_scheme(self)
        from mlm_pipeline.languages import check_settings

        check_settings(self)
        from mlm_pipeline.instances import get_objective

        if self.random_next_sentence and self.objective != "sop":
            raise ValueError(f"--random-next-sentence chooses ALBERT's variant of --objective sop; "
                             f"--objective {self.objective} does not use it")
        if (self.packing != "sentences" or not self.cross_document) and self.objective != "packed":
            raise ValueError(f"--packing and --no-cross-document choose how --objective packed packs; "
                             f"--objective {self.objective} does not use them")
        _check_sources(self)
        from mlm_pipeline.instances.documents import check_format

        check_format(self)  # (--format megatron takes tokenized documents only)
        check = get_objective(self.objective).check
        if check is not None:
            check(self)
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ValueError(
                f"--max-predictions-per-seq ({self.max_predictions_per_seq}) cannot exceed "
                f"--max-seq-length ({self.max_seq_length})"
            )
        return self

    def output_settings(self) -> dict:
        """The settings that determine output bytes (for fingerprints and resume checks)."""
        runtime = {s.name for s in settings_of(type(self)) if s.runtime}
        return {k: v for k, v in self.model_dump().items() if k not in runtime}

    def compared_settings(self) -> dict:
        """The output settings that a resumed run must match, as spelled: all but the paths whose
        content is fingerprinted instead (the tokenizer), so the same vocab elsewhere resumes."""
        return {k: v for k, v in self.output_settings().items() if k not in by_content_names(type(self))}

    def output_fingerprint(self) -> str:
        """SHA-256 of the compared settings; those of :data:`LEFT_OUT_UNSET` only when set, so
        that a run begun before they existed keeps its fingerprint (its task markers count)."""
        settings = {k: v for k, v in self.compared_settings().items() if not (k in LEFT_OUT_UNSET and v is None)}
        blob = json.dumps(settings, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


LEFT_OUT_UNSET = ("id_field", "metadata_field")
"""Settings added after runs were recorded whose unset value (None) changes no output byte."""


MASKING_PARAMETERS = ("ngram", "favor_shorter_ngram", "geometric_p", "span_lower", "span_upper")
"""The settings of particular masking schemes (a scheme's ``parameters`` name those it reads)."""


def _resolve_masking_scheme(data: dict) -> None:
    """Fill in ``masking_scheme`` and ``do_whole_word_mask`` (recorded resolved, so one choice has
    one spelling): no scheme is the objective's default, ``whole-word`` instead of ``token`` with
    ``--do-whole-word-mask`` (the flag's meaning before schemes existed); no
    ``--do-whole-word-mask`` is whole words for the schemes that can mask them."""
    from mlm_pipeline.instances import get_objective, objective_names
    from mlm_pipeline.masking import get_masking_scheme, masking_scheme_names

    wwm = data.get("do_whole_word_mask")
    if data.get("masking_scheme") is None:
        name = data.get("objective", "nsp")
        default = get_objective(name).default_masking_scheme if name in objective_names() else "token"
        data["masking_scheme"] = "whole-word" if wwm and default == "token" else default
    scheme = data["masking_scheme"]
    if wwm is None and scheme in masking_scheme_names():  # (an unknown name fails on the field)
        data["do_whole_word_mask"] = get_masking_scheme(scheme).whole_words != "never"


def _check_masking_scheme(config: "PrepareConfig") -> None:
    """The scheme's settings agree: whole words where it needs them, no parameter of another scheme."""
    from mlm_pipeline.masking import get_masking_scheme

    scheme = get_masking_scheme(config.masking_scheme)
    if scheme.whole_words == "never" and config.do_whole_word_mask:
        raise ValueError(f"--masking-scheme {scheme.name} masks tokens, and --do-whole-word-mask asks for whole "
                         "words: use --masking-scheme whole-word (or leave --masking-scheme out)")
    if scheme.whole_words == "always" and not config.do_whole_word_mask:
        raise ValueError(f"--masking-scheme {scheme.name} masks whole words: --no-do-whole-word-mask does not apply")
    fields = type(config).model_fields
    for name in MASKING_PARAMETERS:
        if name not in scheme.parameters and getattr(config, name) != fields[name].default:
            users = [s for s in _masking_scheme_choices() if name in get_masking_scheme(s).parameters]
            raise ValueError(f"--{name.replace('_', '-')} applies to --masking-scheme {' or '.join(users) or '?'}, "
                             f"not {scheme.name}")
    if scheme.check is not None:
        scheme.check(config)


RECORD_FORMATS = ("auto", "jsonl", "parquet")
"""The --input-format values whose records can have an id and metadata (auto: the files' own)."""


def _check_sources(config: "PrepareConfig") -> None:
    """``--id-field`` and ``--metadata-field`` are refused where they cannot be honoured (rather
    than written nowhere): reference modes, record-less input formats, formats without the columns."""
    asked = [flag for flag, value in (("--id-field", config.id_field), ("--metadata-field", config.metadata_field))
             if value is not None]
    if not asked:
        return
    what = " and ".join(asked)
    if config.metadata_field is not None and not any(n.strip() for n in config.metadata_field.split(",")):
        raise ValueError(f"--metadata-field names no field: {config.metadata_field!r}")
    if config.reference:
        raise ValueError(f"--reference writes what its reference script writes, which names no source records: "
                         f"leave out {what}")
    if config.input_format not in RECORD_FORMATS:
        raise ValueError(f"{what} name fields of JSONL records and Parquet rows: --input-format "
                         f"{config.input_format} has no such fields")
    from mlm_pipeline.formats import get_output_format, output_format_names

    if not get_output_format(config.format).carries_sources:
        able = [name for name in output_format_names() if get_output_format(name).carries_sources]
        raise ValueError(f"{what}: --format {config.format} has no column for each instance's source records "
                         f"(use --format {' or '.join(able)}, or leave out {what})")


def _hub_name(tokenizer: str) -> bool:
    """A Hugging Face hub id (``bert-base-uncased``) that is not a local path: kept as given."""
    from mlm_pipeline.tokenize.hub import looks_like_hub_name

    return not os.path.exists(tokenizer) and looks_like_hub_name(tokenizer)


@dataclass(frozen=True)
class Setting:
    """One field of a settings model, as the command line and config files see it."""

    name: str
    value_type: Any  # bool, int, float, str, list[str] or a Literal; None stripped
    default: Any  # as declared (sizes as text); ``...`` when required
    help: str
    panel: str
    flags: tuple[str, ...]  # command-line spellings, the main one first; () when positional
    google: str | None  # its name in create_pretraining_data.py
    positional: bool
    metavar: str | None
    runtime: bool  # True: does not change output bytes
    text: bool  # True: the model parses it from text (sizes), so the command line passes text
    registry_choices: Callable[[], list[str]] | None = None  # a registry's names (see setting())
    by_content: bool = False  # a path fingerprinted by its content (see setting())

    @property
    def required(self) -> bool:
        return self.default is ...

    @property
    def choices(self) -> tuple | None:
        if self.registry_choices is not None:
            return tuple(self.registry_choices())
        return typing.get_args(self.value_type) if typing.get_origin(self.value_type) is Literal else None

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.value_type) is list

    @property
    def label(self) -> str:
        """How messages name it: its main flag without dashes (``split-size``), or the field name."""
        return self.flags[0].lstrip("-") if self.flags else self.name

    def names(self) -> set[str]:
        """Its spellings in a config file (``-`` and ``_`` alike): the field name, every long
        flag and Google's name."""
        long_flags = (f[2:] for f in self.flags if f.startswith("--"))
        return {n.replace("-", "_") for n in (self.name, self.google, *long_flags) if n}


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else Union[tuple(args)]
    return annotation


_GOOGLE_SPELLED: set[str] = set()
"""The settings this process's command line gave with Google's flag names (``--do_lower_case``):
messages name a flag as the user wrote it."""


def note_google_spelling(name: str | None) -> None:
    """Note that this command line gave setting ``name`` by Google's name; None: a new command line
    starts (an earlier one's spellings, in the same process, are forgotten)."""
    if name is None:
        _GOOGLE_SPELLED.clear()
    else:
        _GOOGLE_SPELLED.add(name)


def flag_for(name: str, value: Any = None, model: type[BaseModel] | None = None) -> str:
    """How the user would write setting ``name`` (with ``value``, for a switch: on or off), in the
    spelling they used for it: ``--do_lower_case=False`` after Google's flags, else ours,
    ``--no-do-lower-case``."""
    s = next(s for s in settings_of(model or PrepareConfig) if s.name == name)
    if s.google and name in _GOOGLE_SPELLED:
        return f"--{s.google}={value}" if s.value_type is bool else f"--{s.google}"
    if s.value_type is bool and value is not None:
        return s.flags[0] if value else f"--no-{s.flags[0][2:]}"
    return s.flags[0]


@functools.cache
def settings_of(model: type[BaseModel] = PrepareConfig) -> tuple[Setting, ...]:
    """The fields of ``model`` (each declared with :func:`setting`), in declaration order."""
    out = []
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra
        if not isinstance(extra, dict) or "panel" not in extra:
            raise TypeError(f"{model.__name__}.{name} is not declared with setting(): the CLI cannot offer it")
        out.append(Setting(
            name=name, value_type=_without_none(field.annotation),
            default=... if field.default is PydanticUndefined else field.default,
            help=field.description or "", panel=extra["panel"],
            flags=() if extra["positional"] else tuple(extra["flags"] or [f"--{name.replace('_', '-')}"]),
            google=extra["google"], positional=extra["positional"], metavar=extra["metavar"],
            runtime=extra["runtime"], text=any(isinstance(m, BeforeValidator) for m in field.metadata),
            registry_choices=extra.get("choices"), by_content=extra.get("by_content", False),
        ))
    return tuple(out)


def settings_as_recorded_now(recorded: dict, model: type[BaseModel] = PrepareConfig) -> dict:
    """A run record's settings with those its version had not yet (a setting added since) filled in
    as that version behaved, so that resuming a run started by an earlier version is not refused
    for settings it never had: a new setting's default keeps the earlier behaviour, and the masking
    scheme was whole words exactly when ``do_whole_word_mask`` was on."""
    filled = dict(recorded)
    if "masking_scheme" not in filled:
        filled["masking_scheme"] = "whole-word" if recorded.get("do_whole_word_mask") else "token"
    for s in settings_of(model):
        if s.name not in filled and not s.runtime and not s.required:
            filled[s.name] = s.default
    return filled


def by_content_names(model: type[BaseModel] = PrepareConfig) -> frozenset[str]:
    """Fields whose content, not spelling, identifies them (see :func:`setting`)."""
    return frozenset(s.name for s in settings_of(model) if s.by_content)


def build_config(values: dict, model: type[BaseModel] = PrepareConfig) -> Any:
    """``model(**values)``, its validation errors as one :class:`ConfigError` naming the flags."""
    try:
        return model(**values)
    except ValidationError as exc:
        label = {s.name: s.label for s in settings_of(model)}
        lines = []
        for err in exc.errors():
            loc = [str(x) for x in err["loc"]]
            if loc:
                loc[0] = label.get(loc[0], loc[0].replace("_", "-"))
            message = err["msg"].removeprefix("Value error, ")  # pydantic's wording for a ValueError
            lines.append(f"{'.'.join(loc)}: {message}" if loc else message)  # (a check of several settings)
        raise ConfigError("invalid settings:\n  " + "\n  ".join(lines)) from None
