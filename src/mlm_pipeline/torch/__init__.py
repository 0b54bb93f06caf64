"""Training from prepared shards with PyTorch (the ``torch`` extra).

- :class:`MLMDataset`: an ``IterableDataset`` over a prepared output (local or ``s3://``…),
  TFRecord or Parquet shards, split over DDP ranks and DataLoader workers so that every instance
  is seen exactly once per epoch, shuffled deterministically from ``(seed, epoch)``, resumable
  mid-epoch.
- :class:`MLMDataLoader`: a DataLoader around it that counts what the training loop consumed,
  so its ``state_dict()`` is exact (PyTorch Lightning saves it in checkpoints).
- :class:`MLMCollator`: batches for ``BertForPreTraining`` / ``BertForMaskedLM``, with the
  shards' static masks or dynamic (token or whole-word) masking seeded per sample.
- :mod:`mlm_pipeline.torch.train`: a tiny BERT trained with PyTorch Lightning
  (``mlm-pipeline train``).

``import mlm_pipeline`` never imports this package (nor torch).
"""

from mlm_pipeline.torch.collator import IGNORE_INDEX, MLMCollator
from mlm_pipeline.torch.dataset import MLMDataLoader, MLMDataset, PreparedOutput, load_prepared

__all__ = ["IGNORE_INDEX", "MLMCollator", "MLMDataLoader", "MLMDataset", "PreparedOutput", "load_prepared"]
