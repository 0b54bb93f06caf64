"""Training from prepared shards with PyTorch (the ``torch`` extra).

- :class:`MLMDataset` (:mod:`.dataset`): an ``IterableDataset`` over a prepared output (local or
  ``s3://``…), or a weighted mix of several, read with the reader of the format each manifest
  records, split over DDP ranks and DataLoader workers so that every instance is seen exactly
  once per epoch, shuffled deterministically from ``(seed, epoch)`` with shards read side by side,
  optionally batched by length bins, resumable mid-epoch. The epoch's stream (mix, interleaving)
  is :mod:`.stream`; ranks, windows, bins and workers are :mod:`.epoch_plan`; what it reads from
  an output is :mod:`.manifest`.
- :class:`MLMDataLoader` (:mod:`.loader`): a DataLoader around it that counts what the training
  loop consumed, so its ``state_dict()`` is exact (PyTorch Lightning saves it in checkpoints).
- :class:`MLMCollator`: batches for ``BertForPreTraining`` / ``BertForMaskedLM``, with the
  shards' static masks or dynamic (token or whole-word) masking seeded per sample.
- :mod:`mlm_pipeline.torch.train`: a tiny BERT trained with PyTorch Lightning
  (``mlm-pipeline train``); its checkpoints (random state, SIGTERM, ``--resume``) are
  :mod:`.checkpoint`.

``import mlm_pipeline`` never imports this package (nor torch).
"""

from mlm_pipeline.torch.collator import IGNORE_INDEX, MLMCollator
from mlm_pipeline.torch.dataset import MLMDataset
from mlm_pipeline.torch.loader import MLMDataLoader
from mlm_pipeline.torch.manifest import PreparedOutput, load_prepared

__all__ = ["IGNORE_INDEX", "MLMCollator", "MLMDataLoader", "MLMDataset", "PreparedOutput", "load_prepared"]
