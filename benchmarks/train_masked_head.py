"""Training step of a tiny BERT: MLM head on masked positions only vs on every position.

    python benchmarks/train_masked_head.py PREPARED_OUTPUT [--steps 10] [--batch-size 32]

Same batches, same model, alternating runs in one process, one torch thread. Prints the median
seconds per step (forward + backward + AdamW) of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertForPreTraining

from mlm_pipeline.torch import MLMDataLoader, MLMDataset
from mlm_pipeline.torch.train import masked_lm_losses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ds = MLMDataset(args.data, seed=0)
    collator = ds.collator()
    batches = []
    for b in MLMDataLoader(ds, batch_size=args.batch_size, collate_fn=collator):
        batches.append(b)
        if len(batches) == args.steps:
            break
    cfg = BertConfig(vocab_size=collator.vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=2, intermediate_size=4 * args.hidden,
                     max_position_embeddings=ds.prepared.max_seq_length or 512)
    model = BertForPreTraining(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def masked_only(b):
        return masked_lm_losses(model, b)["loss"]

    def every_position(b):  # the model's own loss: logits for all B x L positions
        return model(**b).loss

    times = {"masked positions only": [], "every position (model(**batch).loss)": []}
    fns = dict(zip(times, (masked_only, every_position)))
    for b in batches:
        for name, fn in fns.items():
            t = time.perf_counter()
            loss = fn(b)
            loss.backward()
            opt.step()
            opt.zero_grad()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:<40} {v * 1000:8.1f} ms/step")
    a, b = med.values()
    print(f"every position / masked only: {b / a:.1f}x  (batch {args.batch_size}, "
          f"length {batches[0]['input_ids'].shape[1]}, hidden {args.hidden}, layers {args.layers})")


if __name__ == "__main__":
    main()
