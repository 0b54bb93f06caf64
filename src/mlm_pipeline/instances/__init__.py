"""Instance building: one module per objective, registered here by name.

Every objective is an :class:`~mlm_pipeline.instances.base.Objective` with one build signature,
``build(docs: TokenizedDocs, ctx: BuildContext) -> (InstanceBatch, counts)``; the task looks an
objective up by ``config.objective`` and calls it, then masks (its own stage, ``mlm_pipeline.masking``).
A new objective is one module here holding an ``OBJECTIVE`` plus one line in ``_registry`` below
(or one ``register_objective`` call from anywhere, e.g. a test or a plug-in imported before the
run).

The built-in modules are imported on the first registry call, not with this package: the
batch type, the masker and the writers import ``instances.batch`` without pulling in every
builder (and the reference mode's tokenizer and file-system imports).

Built in:

* ``nsp`` (``nsp.py``): BERT sentence pairs with next-sentence labels; its reference mode
  (``reference.py``) reproduces google-research/bert's ``create_pretraining_data.py``.
* ``sop`` (``sop.py``): ALBERT sentence-order pairs with ``token_boundary``; its reference mode
  (``albert_reference.py``) reproduces google-research/albert's ``create_pretraining_data.py``.
* ``packed`` (``packed.py``): RoBERTa FULL-SENTENCES packing.
* ``tokens`` (``tokens.py``): tokenize only, plain windows for masking at load time.
* ``electra`` (``electra.py``): google-research/electra's ``build_pretraining_dataset.py``
  examples (three features, masked at training time); its reference mode reproduces that
  script's output file for file.
* ``sentences`` and ``documents`` (``documents.py``): tokenized documents, unmasked, for
  ``--format megatron`` (Megatron builds its instances itself).
"""

from __future__ import annotations

from mlm_pipeline.errors import ConfigError
from mlm_pipeline.instances.base import (
    BuildContext,
    Objective,
    ReferenceContext,
    ReferenceMode,
    TokenizedDocs,
)

__all__ = [
    "BuildContext",
    "Objective",
    "ReferenceContext",
    "ReferenceMode",
    "TokenizedDocs",
    "get_objective",
    "objective_names",
    "register_objective",
    "unregister_objective",
]

_OBJECTIVES: dict[str, Objective] = {}
_built_in_loaded = False


def _registry() -> dict[str, Objective]:
    """The registry, with the built-in objectives registered first (on the first call)."""
    global _built_in_loaded
    if not _built_in_loaded:
        from mlm_pipeline.instances import documents, electra, nsp, packed, sop, tokens

        for objective in (nsp.OBJECTIVE, packed.OBJECTIVE, tokens.OBJECTIVE, electra.OBJECTIVE, sop.OBJECTIVE,
                          documents.SENTENCES, documents.DOCUMENTS):
            _OBJECTIVES[objective.name] = objective
        _built_in_loaded = True
    return _OBJECTIVES


def register_objective(objective: Objective, *, replace: bool = False) -> Objective:
    """Make ``objective`` available as ``--objective NAME``; returns it.

    Registering a taken name raises ``ValueError`` unless ``replace`` is set. A spawned worker
    process (Ray's, and the local pool's when the driver runs other threads) knows an objective
    registered at run time (not by importing this package) only if the module that registers it
    is imported there too; ship such an objective as a module, or run with one worker.
    """
    if not isinstance(objective, Objective):
        raise TypeError(f"register_objective takes an Objective, got {type(objective).__name__}")
    if not objective.name or not objective.name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"objective name must be letters, digits, '-' or '_', got {objective.name!r}")
    registry = _registry()
    if objective.name in registry and not replace:
        raise ValueError(f"objective {objective.name!r} is already registered")
    registry[objective.name] = objective
    return objective


def unregister_objective(name: str) -> None:
    """Remove a registered objective (a test's or plug-in's clean-up); unknown names are ignored."""
    _registry().pop(name, None)


def get_objective(name: str) -> Objective:
    """The objective registered as ``name``; ``ConfigError`` naming the known ones otherwise."""
    try:
        return _registry()[name]
    except KeyError:
        raise ConfigError(
            f"unknown objective {name!r} (known: {', '.join(objective_names())})"
        ) from None


def objective_names() -> tuple[str, ...]:
    """Registered objective names, in registration order (the built-in ones first)."""
    return tuple(_registry())
