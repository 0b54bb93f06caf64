"""The loader: a DataLoader over an :class:`MLMDataset` that knows how far the training loop got."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlm_pipeline.torch.dataset import MLMDataset

__all__ = ["MLMDataLoader", "PassProgress"]


class MLMDataLoader:
    """A ``torch.utils.data.DataLoader`` over an :class:`MLMDataset` with exact resume state.

    It counts the batches it hands out, so :meth:`state_dict` is the position of the training
    loop, with or without worker processes; PyTorch Lightning saves and restores it in its
    checkpoints (it has ``state_dict``/``load_state_dict`` and an exact ``len``, so Lightning
    does not prefetch past the step being checkpointed).

    ``len`` is the batches of a whole epoch, as a DataLoader's is, also after a state was loaded
    mid-epoch: the pass then yields only the rest of the epoch, and Lightning, which restores its
    own batch index with the loader's state, ends the epoch where an uninterrupted run does (a
    length of the rest made it end the resumed epoch early and keep that length for every later
    one).

    Iterating again after a partial pass continues the same epoch; after a full pass, the next
    epoch starts (``dataset.epoch`` + 1). Workers are never persistent (each pass sends the
    workers the current epoch and position) and ``drop_last`` is not offered: no sample is lost.
    Each worker batches its own samples, so an epoch ends with up to ``num_workers`` short
    batches; ``len(loader)`` counts them exactly.
    """

    def __init__(
        self,
        dataset: MLMDataset,
        *,
        batch_size: int,
        collate_fn,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        timeout: float = 0,
        multiprocessing_context=None,
        worker_init_fn=None,
    ):
        if not isinstance(dataset, MLMDataset):
            raise ValueError(f"MLMDataLoader needs an MLMDataset, got {type(dataset).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if dataset.bin_batch_size and dataset.bin_batch_size != batch_size:
            raise ValueError(f"the dataset's length bins are cut into batches of {dataset.bin_batch_size}, "
                             f"not {batch_size}: give both the same batch size")
        _check_tokenizer(dataset, collate_fn)
        if getattr(collate_fn, "masking", None) == "static" and not dataset.prepared.is_masked:
            # (every label -100: a NaN loss, not an error, in a training step)
            raise ValueError(f"{dataset.prepared.url} was prepared without masks (masking: none), so a collator with "
                             "masking='static' would give no labels: use masking='dynamic' (or dataset.collator())")
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self._loader_kwargs = {
            "pin_memory": pin_memory,
            "timeout": timeout,
            "multiprocessing_context": multiprocessing_context,
            "worker_init_fn": worker_init_fn,
        }
        if num_workers and prefetch_factor is not None:
            self._loader_kwargs["prefetch_factor"] = prefetch_factor
        self._pass: PassProgress | None = None  # the current (or just finished) pass

    def _current_pass(self) -> PassProgress | None:
        """The current (or just finished) pass, unless the dataset's position was set since it
        began (``dataset.set_epoch``, ``load_state_dict``): its batches then belong to the old one."""
        done = self._pass
        return done if done is not None and done.position == self.dataset.position_changes else None

    def _close_pass(self) -> None:
        """Fold the current pass into the dataset's position (the next epoch if it is complete)."""
        done = self._current_pass()
        self.dataset.advance(batches=done.consumed if done else 0, batch_size=self.batch_size,
                             num_workers=self.num_workers, epoch_complete=bool(done and done.finished))
        self._end_pass()

    def _end_pass(self) -> None:
        if self._pass is not None:
            self._pass.stale = True
        self._pass = None

    def __iter__(self):
        self._close_pass()
        self._pass = PassProgress(length=self.dataset.num_batches(self.batch_size, self.num_workers),
                                  position=self.dataset.position_changes)
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=False,
            drop_last=False,
            generator=self._pass_generator(),
            **self._loader_kwargs,
        )
        return _PassIterator(iter(loader), self._pass)

    def _pass_generator(self) -> torch.Generator:
        """The generator a pass draws its workers' seeds from: one of (seed, epoch), not torch's
        global one, from which a DataLoader draws by default. Then starting a pass draws nothing
        that the model's dropout would draw next, so a run resumed at another point of an epoch
        (whose pass began elsewhere) keeps an uninterrupted run's dropout draws."""
        generator = torch.Generator()
        generator.manual_seed((self.dataset.seed * 1_000_003 + self.dataset.epoch) % (1 << 63))
        return generator

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank (a pass resumed mid-epoch yields the rest of it:
        :meth:`remaining`)."""
        return self.dataset.num_batches_of_epoch(self.batch_size, self.num_workers)

    def remaining(self) -> int:
        """Batches the current pass still yields (or the next one, if none is under way)."""
        done = self._current_pass()
        if done is not None and not done.finished:
            return done.length - done.consumed
        if done is not None:
            return self.dataset.num_batches_of_epoch(self.batch_size, self.num_workers)
        return self.dataset.num_batches(self.batch_size, self.num_workers)

    def state_dict(self) -> dict:
        """Position after the batches handed out so far (see :meth:`MLMDataset.state_dict`)."""
        done = self._current_pass()
        return self.dataset.state_dict(batches=done.consumed if done else 0, batch_size=self.batch_size,
                                       num_workers=self.num_workers, epoch_complete=bool(done and done.finished))

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)
        self._end_pass()


def _check_tokenizer(dataset: MLMDataset, collate_fn) -> None:
    """A collator built on another vocab than the shards' would mask with its own ``[MASK]`` id and
    draw random tokens from its own vocab, silently: refused. A collator given the same vocab
    file without the run's lower-casing or flavour is still the same vocab, so it is read again
    with the run's settings before it is refused."""
    recorded = dataset.prepared.tokenizer_fingerprint
    mine = getattr(collate_fn, "tokenizer_fingerprint", None)
    if not recorded or not mine or mine == recorded:
        return
    path = getattr(collate_fn, "tokenizer_path", None)
    if path:
        try:
            dataset.prepared.tokenizer(str(path))  # read with the run's settings; ValueError if another
            return
        except (OSError, ValueError):
            pass
    raise ValueError(f"the collator's tokenizer ({path or 'given as an object'}) is not the one that prepared "
                     f"{dataset.prepared.url}: its fingerprint differs from the manifest's, so its [MASK] and random "
                     "tokens would be another vocab's; build it with dataset.collator(), or from the run's tokenizer")


@dataclass
class PassProgress:
    """What one pass of a loader has handed out: written by the pass's iterator, read by the loader."""

    length: int  # batches of the pass
    position: int  # the dataset's ``position_changes`` when the pass began
    consumed: int = 0  # batches handed out so far
    finished: bool = False  # the pass ran to its end
    stale: bool = False  # the loader has since started another pass or loaded a state


class _PassIterator:
    """The batches of one pass, counted into its :class:`PassProgress`."""

    def __init__(self, inner, progress: PassProgress):
        self._inner = inner
        self._progress = progress

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return 0 if self._progress.stale else self._progress.length

    def __next__(self):
        progress = self._progress
        if progress.stale:
            raise RuntimeError("this iterator is stale: the loader started a new pass or loaded a state")
        try:
            batch = next(self._inner)
        except StopIteration:
            progress.finished = True
            raise
        progress.consumed += 1
        return batch
