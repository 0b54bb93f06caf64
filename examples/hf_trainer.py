"""Train a small BERT masked LM on a prepared output with the Hugging Face ``Trainer``.

    python examples/hf_trainer.py OUT RUN_DIR --max-steps 100
    torchrun --nproc_per_node 2 examples/hf_trainer.py OUT RUN_DIR --max-steps 100      # DDP (gloo on CPU)
    python examples/hf_trainer.py OUT RUN_DIR --max-steps 100 --resume RUN_DIR/checkpoint-50

``MLMDataset`` and its collator go to ``Trainer`` as they are. Three settings matter:

- the dataset is built with ``rank=0, world_size=1``: every process sees the same stream and
  accelerate deals its batches out to the processes (``IterableDatasetShard``), so it must not be
  split by rank a second time;
- ``accelerator_config={"dispatch_batches": False}``: each process collates its own batches
  (dispatching concatenates the processes' batches, which needs equal padded widths);
- ``remove_unused_columns=False``: the collator needs the samples' ``index`` and ``epoch`` (the
  keys of dynamic masks), which are not arguments of the model.

The Trainer calls ``set_epoch`` on the dataset each epoch, and on resuming mid-epoch it skips the
batches already trained on by iterating past them: the order is a pure function of the seed and
the epoch, so the resumed run sees the same remaining batches. ``--record DIR`` writes, per
process, the sample indices of each step, and ``--check-resume STEP`` trains a second time from
a checkpoint of the first run (what the test compares).
"""

from __future__ import annotations

import argparse
import json
import os


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", help="a prepared output (mlm-pipeline prepare)")
    ap.add_argument("run_dir")
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16, help="per process")
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--resume", default=None, help="a checkpoint directory of an earlier run")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--record", default=None, help="write each process's sample indices per step here")
    ap.add_argument("--check-resume", type=int, default=None, metavar="STEP",
                    help="after training, train again from RUN_DIR/checkpoint-STEP into RUN_DIR/resumed")
    args = ap.parse_args(argv)

    record = {"first": train(args, args.run_dir, args.resume)}
    if args.check_resume:  # the same processes train again from a checkpoint of the first run
        checkpoint = os.path.join(args.run_dir, f"checkpoint-{args.check_resume}")
        record["resumed"] = train(args, os.path.join(args.run_dir, "resumed"), checkpoint)
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        with open(os.path.join(args.record, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(record, f)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # a gloo group left to the interpreter's exit can abort a rank ("terminate called
        # without an active exception") after training has finished
        dist.destroy_process_group()
    return 0


def train(args, run_dir: str, resume: str | None) -> dict:
    """One ``Trainer.train``; returns the first step it trained and each step's sample indices."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

    from mlm_pipeline.torch import MLMDataset

    dataset = MLMDataset(args.output, seed=0, shuffle_buffer=1024, rank=0, world_size=1)
    collator = dataset.collator(masking="dynamic", pad_to_multiple_of=8, sample_info=bool(args.record))
    config = BertConfig(vocab_size=dataset.prepared.tokenizer().vocab_size, hidden_size=args.hidden,
                        num_hidden_layers=args.layers, num_attention_heads=2, intermediate_size=4 * args.hidden,
                        max_position_embeddings=dataset.prepared.max_seq_length or 512)
    steps: list[list[int]] = []

    class Model(BertForMaskedLM):
        def forward(self, sample_index=None, sample_weight=None, next_sentence_label=None, **kwargs):
            if sample_index is not None:  # --record: note what this step trains on
                steps.append(sample_index.tolist())
            return super().forward(**kwargs)

    torch.manual_seed(0)
    training = TrainingArguments(
        output_dir=run_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=5e-4, save_strategy="steps", save_steps=args.save_steps,
        logging_steps=max(1, args.max_steps // 10), report_to=[], use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        remove_unused_columns=False, accelerator_config={"dispatch_batches": False}, dataloader_num_workers=0,
        disable_tqdm=True, seed=0,
    )
    trainer = Trainer(model=Model(config), args=training, train_dataset=dataset, data_collator=collator)
    trainer.train(resume_from_checkpoint=resume)
    return {"first_step": trainer.state.global_step - len(steps) + 1, "steps": steps}


if __name__ == "__main__":
    raise SystemExit(main())
