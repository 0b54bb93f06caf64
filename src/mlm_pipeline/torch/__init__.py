"""Training from prepared shards with PyTorch (the ``torch`` extra).

- :class:`MLMDataset` (:mod:`.dataset`): an ``IterableDataset`` over a prepared output (local or
  ``s3://``…), read with the reader of the format its manifest records, split over DDP ranks and
  DataLoader workers so that every instance is seen exactly once per epoch, shuffled
  deterministically from ``(seed, epoch)``, resumable mid-epoch. Which samples in which order is
  :mod:`.epoch_plan`; what it reads from the output is :mod:`.manifest`.
- :class:`MLMDataLoader` (:mod:`.loader`): a DataLoader around it that counts what the training
  loop consumed, so its ``state_dict()`` is exact (PyTorch Lightning saves it in checkpoints).
- :class:`MLMCollator`: batches for ``BertForPreTraining`` / ``BertForMaskedLM``, with the
  shards' static masks or dynamic (token or whole-word) masking seeded per sample.
- :mod:`mlm_pipeline.torch.train`: a tiny BERT trained with PyTorch Lightning
  (``mlm-pipeline train``).

``import mlm_pipeline`` never imports this package (nor torch).
"""

from mlm_pipeline.torch.collator import IGNORE_INDEX, MLMCollator
from mlm_pipeline.torch.dataset import MLMDataset
from mlm_pipeline.torch.loader import MLMDataLoader
from mlm_pipeline.torch.manifest import PreparedOutput, load_prepared

__all__ = ["IGNORE_INDEX", "MLMCollator", "MLMDataLoader", "MLMDataset", "PreparedOutput", "load_prepared"]
