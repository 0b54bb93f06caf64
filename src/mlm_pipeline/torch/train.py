"""A tiny BERT or ALBERT trained on prepared shards with PyTorch Lightning (``mlm-pipeline train``).

The model is ``transformers``' ``BertForPreTraining`` (shards with NSP labels) or
``BertForMaskedLM`` (packed / tokens-only shards) with a few small layers; for ``sop`` shards
(``--model auto``, or ``--model albert``) ``AlbertForPreTraining`` (MLM + sentence-order
prediction; ``AlbertForMaskedLM`` on shards without pair labels), with ALBERT's factorized
embeddings (``embedding_size`` below ``hidden``) and its layers sharing their weights. The
pair loss (NSP or SOP) is logged as ``nsp_loss``. The masked-LM loss is
computed at the masked positions only: the encoder's hidden states are gathered there before the
prediction head, so the vocabulary-sized softmax runs on ~15 % of the tokens instead of all of
them (about 5x less work on a CPU for a 30k vocabulary and a small encoder).

Writes to ``output_dir``: ``loss.csv`` (one row per step), ``summary.json`` (losses before and
after, timings), ``checkpoints/`` (Lightning checkpoints, with the data loader's position, so
``--resume`` continues mid-epoch with the very batches an uninterrupted run would have seen) and
``model/`` (``save_pretrained`` format). A checkpoint also holds the random generators' state
(dropout draws from torch's), so a resumed run's losses are an uninterrupted run's.

SIGTERM (a scheduler pre-empting the job, ``kill``) ends the run after the step under way: it
saves ``checkpoints/step=N.ckpt`` and raises :class:`~mlm_pipeline.torch.checkpoint.TrainingTerminated`
(the command exits 143); no ``summary.json`` or ``model/`` is written, as the run has not
finished. What a checkpoint holds and how ``--resume`` reads one: :mod:`.checkpoint`.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import signal
import sys
import time
import warnings
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from mlm_pipeline.environment import configure_process
from mlm_pipeline.torch.checkpoint import (OutputDir, TrainingTerminated, checkpoint_on_sigterm_callback,
                                           load_checkpoint, no_checkpoint_at, random_state_callback)
from mlm_pipeline.torch.collator import IGNORE_INDEX
from mlm_pipeline.torch.dataset import MLMDataset
from mlm_pipeline.torch.loader import MLMDataLoader

_ROW_BUCKET = 128
MODELS = ("auto", "bert", "albert")


@dataclass
class TrainConfig:
    data: str
    steps: int = 200
    batch_size: int = 32
    lr: float = 1e-3
    layers: int = 2
    hidden: int = 128
    heads: int = 2
    intermediate: int | None = None  # default 4 * hidden
    model: str = "auto"  # auto | bert | albert (auto: albert for sop shards, else bert)
    embedding_size: int | None = None  # ALBERT's factorized embeddings; default max(16, hidden // 4)
    masking: str = "auto"  # auto | static | dynamic | electra (auto: the output's, see MLMDataset.collator)
    whole_word_mask: bool = False
    masking_scheme: str | None = None  # dynamic masking's scheme (mlm_pipeline.masking): token, whole-word, ngram, span
    seed: int = 0
    output_dir: str = "train-out"
    num_workers: int = 0
    warmup_steps: int | None = None  # default 10 % of steps
    shuffle_buffer: int = 10_000
    eval_batches: int = 4
    save_every: int = 0  # also checkpoint every N steps (0: only at the end)
    resume: str | None = None  # a checkpoint to continue from
    overwrite_output_dir: bool = False  # replace an earlier run's checkpoints in output_dir (else refused)
    tokenizer: str | None = None  # default: the one in the manifest
    threads: int | None = None  # torch.set_num_threads
    log_every: int = 10  # a loss line every N steps when no progress bar is shown (0: none)
    progress: bool | None = None  # a progress bar with the loss; None: when stderr is a terminal

    def validate(self) -> None:
        positive = {"steps": self.steps, "batch_size": self.batch_size, "layers": self.layers,
                    "hidden": self.hidden, "heads": self.heads}
        bad = [f"{k} must be >= 1 (got {v})" for k, v in positive.items() if v < 1]
        if self.lr <= 0:
            bad.append(f"lr must be > 0 (got {self.lr})")
        if self.hidden % self.heads:
            bad.append(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.model not in MODELS:
            bad.append(f"model must be {', '.join(MODELS)} (got {self.model!r})")
        if self.embedding_size is not None and (self.embedding_size < 1 or self.model == "bert"):
            bad.append(f"embedding_size applies to ALBERT and must be >= 1 (got {self.embedding_size}, "
                       f"model {self.model})")
        if self.masking not in ("auto", "static", "dynamic", "electra"):
            bad.append(f"masking must be auto, static, dynamic or electra (got {self.masking!r})")
        if self.whole_word_mask and self.masking in ("static", "electra"):
            bad.append("whole_word_mask needs dynamic masking")
        if self.num_workers < 0 or self.eval_batches < 0 or self.save_every < 0:
            bad.append("num_workers, eval_batches and save_every must be >= 0")
        if self.resume and not os.path.isfile(self.resume):
            bad.append(no_checkpoint_at(self.resume, self.output_dir))
        if bad:
            raise ValueError("invalid training settings: " + "; ".join(bad))


def _heads(model) -> tuple:
    """(encoder, masked-LM head, pair head or None) of a BERT or ALBERT pretraining model."""
    if hasattr(model, "cls"):  # BertForPreTraining / BertForMaskedLM
        return model.bert, model.cls.predictions, getattr(model.cls, "seq_relationship", None)
    return model.albert, model.predictions, getattr(model, "sop_classifier", None)  # Albert*


def masked_lm_losses(model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MLM (+ NSP or SOP) cross-entropy of a BERT or ALBERT pretraining model on a batch.

    The prediction head runs only on the hidden states of masked positions.
    """
    encoder, mlm_head, pair_head = _heads(model)
    out = encoder(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
    )
    flat_labels = batch["labels"].reshape(-1)
    where = torch.nonzero(flat_labels != IGNORE_INDEX).squeeze(1)
    masked = len(where)
    if masked:
        # Round the number of rows up (padding rows are ignored by the loss): a few distinct
        # [rows, vocab] shapes let the allocator reuse blocks instead of fragmenting the heap.
        rows = -(-masked // _ROW_BUCKET) * _ROW_BUCKET
        where = torch.cat([where, where.new_zeros(rows - masked)])
        targets = torch.cat([flat_labels[where[:masked]], flat_labels.new_full((rows - masked,), IGNORE_INDEX)])
        hidden = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[where]  # [rows, H]
        logits = mlm_head(hidden)
        mlm = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)
    else:  # a batch of padding samples only: no signal, but keep the graph
        mlm = out.last_hidden_state.sum() * 0.0
    result = {"mlm_loss": mlm, "loss": mlm, "masked": torch.tensor(masked)}
    nsp_labels = batch.get("next_sentence_label", batch.get("sentence_order_label"))
    if nsp_labels is not None and pair_head is not None and bool((nsp_labels != IGNORE_INDEX).any()):
        nsp = F.cross_entropy(pair_head(out.pooler_output).float(), nsp_labels, ignore_index=IGNORE_INDEX)
        result["nsp_loss"] = nsp
        result["loss"] = mlm + nsp
    return result


def _lightning_module_class():
    import pytorch_lightning as pl
    import transformers

    class TinyBert(pl.LightningModule):
        def __init__(self, *, vocab_size: int, max_length: int, hidden: int, layers: int, heads: int,
                     intermediate: int, nsp: bool, lr: float, warmup_steps: int, steps: int, pad_id: int,
                     model: str = "bert", embedding_size: int | None = None):
            super().__init__()
            self.save_hyperparameters()
            sizes = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=intermediate,
                         max_position_embeddings=max_length, type_vocab_size=2, pad_token_id=pad_id)
            if model == "albert":  # (AlbertConfig's defaults: one group of layers sharing weights)
                config = transformers.AlbertConfig(**sizes, embedding_size=embedding_size)
            else:
                config = transformers.BertConfig(**sizes)
            family = "Albert" if model == "albert" else "Bert"
            kind = "ForPreTraining" if nsp else "ForMaskedLM"
            self.model = getattr(transformers, family + kind)(config)

        def training_step(self, batch, batch_idx):
            losses = masked_lm_losses(self.model, batch)
            self.log("loss", losses["loss"].detach(), prog_bar=True, on_step=True, batch_size=len(batch["input_ids"]))
            return losses

        def configure_optimizers(self):
            no_decay = ("bias", "LayerNorm.weight")
            params = [
                {"params": [p for n, p in self.named_parameters() if not n.endswith(no_decay)], "weight_decay": 0.01},
                {"params": [p for n, p in self.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
            ]
            optimizer = torch.optim.AdamW(params, lr=self.hparams.lr, betas=(0.9, 0.98), eps=1e-6)
            warmup, total = self.hparams.warmup_steps, self.hparams.steps

            def factor(step: int) -> float:  # linear warm-up, then linear decay to 10 %
                if step < warmup:
                    return (step + 1) / warmup
                return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, total - warmup))

            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return TinyBert


# what Lightning says that a user of `mlm-pipeline train` has no use for: its hardware summary and
# tips (INFO log records), a warning about our IterableDataset's __len__ (the loader shards the data
# across workers itself, so the length is exact) and deprecations inside Lightning itself
_LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric")
_LIGHTNING_WARNINGS = (r".*`IterableDataset` has `__len__` defined", r".*LeafSpec.*is deprecated",
                       r".*does not have many workers which may be a bottleneck",
                       # --resume without --save-every: the checkpoint's ModelCheckpoint state is not needed
                       r".*callbacks used to create the checkpoint need to be provided")


@contextlib.contextmanager
def _quiet_lightning():
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in _LIGHTNING_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _loss_log_callback(path: Path, log_every: int):
    import pytorch_lightning as pl

    class LossLog(pl.Callback):
        """Appends one CSV row per optimizer step and prints every ``log_every`` steps."""

        def __init__(self):
            self.start = time.perf_counter()
            self.rows: list[dict] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            row = {
                "step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "loss": float(outputs["loss"].detach()),
                "mlm_loss": float(outputs["mlm_loss"].detach()),
                "nsp_loss": float(outputs["nsp_loss"].detach()) if "nsp_loss" in outputs else "",
                "masked_tokens": int(outputs["masked"]),
                "batch_crc": batch_crc(batch),
                "lr": trainer.optimizers[0].param_groups[0]["lr"],
                "seconds": round(time.perf_counter() - self.start, 3),
            }
            new = not path.exists()
            with open(path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(row))
                if new:
                    writer.writeheader()
                writer.writerow(row)
            self.rows.append(row)
            if log_every and (row["step"] % log_every == 0 or row["step"] == 1):
                print(f"step {row['step']:>6}  loss {row['loss']:.4f}  mlm {row['mlm_loss']:.4f}  "
                      f"lr {row['lr']:.2e}  {row['seconds']:.1f}s", flush=True)

    return LossLog()


def _ignore_sigterm(worker_id: int) -> None:
    """A DataLoader worker outlives a SIGTERM sent to the whole job (Slurm, a process group): the
    training process stops after its step and ends the workers itself; a worker that died of it
    first would fail the run instead."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def batch_crc(batch: dict[str, torch.Tensor]) -> str:
    """CRC32 of a batch's inputs and labels: equal rows in two loss logs saw the same batch."""
    crc = 0
    for key in ("input_ids", "token_type_ids", "labels", "next_sentence_label", "sentence_order_label"):
        if key in batch:
            crc = zlib.crc32(batch[key].detach().cpu().numpy().tobytes(), crc)
    return f"{crc:08x}"


@torch.no_grad()
def evaluate(model, batches: list[dict]) -> float | None:
    """Mean MLM loss over fixed batches (token-weighted)."""
    if not batches:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        losses = masked_lm_losses(model, batch)
        m = int(losses["masked"])
        total += float(losses["mlm_loss"]) * m
        count += m
    model.train(was_training)
    return total / max(count, 1)


def _check_masking(config: TrainConfig, dataset) -> None:
    """The masking settings against the output, in the command's own flags (the collator's
    messages speak of its Python arguments)."""
    prepared = dataset.prepared
    masking = prepared.auto_masking if config.masking == "auto" else config.masking
    if masking == "static" and not prepared.is_masked:
        raise ValueError(f"{config.data} was prepared without masks (--masking none): train it with "
                         "--masking dynamic, or leave --masking at auto")
    if config.masking_scheme not in (None, "token") and masking != "dynamic":
        how = (f"--masking auto picks {masking} masking for this output" if config.masking == "auto"
               else f"--masking {masking} was given")
        raise ValueError(f"--masking-scheme {config.masking_scheme} needs dynamic masking, and {how}: add "
                         "--masking dynamic")
    if config.whole_word_mask and masking != "dynamic":
        how = (f"--masking auto picks {masking} masking for this output" if config.masking == "auto"
               else f"--masking {masking} was given")
        raise ValueError(f"--whole-word-mask needs dynamic masking, and {how}: add --masking dynamic")


def main(config: TrainConfig) -> dict:
    """Train, checkpoint and return the summary (also written to ``summary.json``)."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    config.validate()
    if config.threads:
        torch.set_num_threads(config.threads)
    configure_process()
    out = Path(config.output_dir)  # (made once the data is accepted: a refused run leaves no directory)
    resume_state = load_checkpoint(config.resume) if config.resume else None
    output_dir = OutputDir.of(config, resume_state.get("global_step", 0) if resume_state else None)
    if (refusal := output_dir.refusal(config)) is not None:
        raise ValueError(refusal)
    pl.seed_everything(config.seed, workers=False, verbose=False)

    dataset = MLMDataset(config.data, shuffle=True, seed=config.seed, shuffle_buffer=config.shuffle_buffer)
    if dataset.total == 0:
        raise ValueError(f"{config.data} holds no instances")
    _check_masking(config, dataset)
    out.mkdir(parents=True, exist_ok=True)
    tok = dataset.prepared.tokenizer(config.tokenizer)
    model = config.model
    if model == "auto":  # the model that reads the output's pair label (sop: AlbertForPreTraining)
        model = "albert" if dataset.prepared.sentence_label == "sentence_order_label" else "bert"
    collator = dataset.collator(masking=config.masking, tokenizer=tok, whole_word_mask=config.whole_word_mask,
                                seed=config.seed, sentence_label="sentence_order_label" if model == "albert"
                                else "next_sentence_label",
                                **({"masking_scheme": config.masking_scheme} if config.masking_scheme else {}))
    loader = MLMDataLoader(dataset, batch_size=config.batch_size, collate_fn=collator,
                           num_workers=config.num_workers, worker_init_fn=_ignore_sigterm)
    # fixed evaluation batches: the first instances of the output, masks of epoch 0
    eval_ds = MLMDataset(dataset.prepared, shuffle=False, shuffle_buffer=config.batch_size)
    eval_batches = []
    for batch in MLMDataLoader(eval_ds, batch_size=config.batch_size, collate_fn=collator):
        if len(eval_batches) >= config.eval_batches:
            break
        eval_batches.append(batch)

    max_length = dataset.prepared.max_seq_length or max(int(b["input_ids"].shape[1]) for b in eval_batches)
    TinyBert = _lightning_module_class()
    module = TinyBert(
        vocab_size=collator.vocab_size, max_length=max(max_length, 8), hidden=config.hidden, layers=config.layers,
        heads=config.heads, intermediate=config.intermediate or 4 * config.hidden, nsp=collator.nsp, lr=config.lr,
        warmup_steps=config.warmup_steps if config.warmup_steps is not None else max(1, config.steps // 10),
        steps=config.steps, pad_id=collator.pad_id, model=model,
        embedding_size=(config.embedding_size or max(16, config.hidden // 4)) if model == "albert" else None,
    )
    if resume_state is not None:  # the weights evaluated "before" are the checkpoint's
        try:
            module.load_state_dict(resume_state["state_dict"])
        except RuntimeError as exc:  # torch: "Error(s) in loading state_dict ... size mismatch for ..."
            detail = " ".join(str(exc).split())
            raise ValueError(f"--resume {config.resume}: the checkpoint holds another model than these settings "
                             f"build (its --model, --layers, --hidden, --heads, vocabulary or objective differ): "
                             f"{detail[:300]}") from None
    loss_before = evaluate(module.model, eval_batches)

    log_path = out / "loss.csv"
    output_dir.clear()  # (the settings and the checkpoint passed every check)
    bar = sys.stderr.isatty() if config.progress is None else config.progress
    loss_log = _loss_log_callback(log_path, 0 if bar else config.log_every)  # the bar shows the loss
    on_sigterm = checkpoint_on_sigterm_callback(out / "checkpoints")
    callbacks = [loss_log, random_state_callback(), on_sigterm]
    if config.save_every:
        callbacks.append(ModelCheckpoint(dirpath=out / "checkpoints", filename="step={step}", every_n_train_steps=config.save_every,
                                         save_top_k=-1, auto_insert_metric_name=False, save_last=False))
    if bar:
        from pytorch_lightning.callbacks import TQDMProgressBar

        callbacks.append(TQDMProgressBar(refresh_rate=1))
    with _quiet_lightning():
        trainer = pl.Trainer(
            max_steps=config.steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
            enable_progress_bar=bar, enable_model_summary=False, enable_checkpointing=bool(config.save_every),
            callbacks=callbacks, num_sanity_val_steps=0, use_distributed_sampler=False,
        )
        started = time.perf_counter()
        try:
            # a checkpoint is loaded as tensors and plain data only (no pickled code runs from it)
            trainer.fit(module, train_dataloaders=loader, ckpt_path=config.resume, weights_only=True)
        except SystemExit:  # Lightning's SIGTERMException
            if on_sigterm.saved is None:
                raise
            raise TrainingTerminated(on_sigterm.saved, trainer.global_step, config.steps) from None
        seconds = time.perf_counter() - started
    (out / "checkpoints").mkdir(exist_ok=True)
    trainer.save_checkpoint(out / "checkpoints" / "last.ckpt", weights_only=False)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    module.model.save_pretrained(out / "model")
    loss_after = evaluate(module.model, eval_batches)

    rows = loss_log.rows
    tail = rows[-max(1, min(10, len(rows) // 5)):] if rows else []
    summary = {
        "config": asdict(config),
        "model": type(module.model).__name__,
        "parameters": sum(p.numel() for p in module.model.parameters()),
        "masking": collator.masking,
        "masking_scheme": collator.masking_scheme,
        "steps_run": len(rows),
        "final_step": trainer.global_step,
        "first_train_loss": rows[0]["loss"] if rows else None,
        "last_train_loss_mean": sum(r["loss"] for r in tail) / len(tail) if tail else None,
        "eval_mlm_loss_before": loss_before,
        "eval_mlm_loss_after": loss_after,
        "uniform_loss": math.log(collator.vocab_size),
        "seconds": round(seconds, 2),
        "seconds_per_step": round(seconds / max(1, len(rows)), 4),
        "data_position": loader.state_dict(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
