"""Instance building: one module per objective, registered here by name.

Every objective is an :class:`~mlm_pipeline.instances.base.Objective` with one build signature,
``build(docs: TokenizedDocs, ctx: BuildContext) -> (InstanceBatch, counts)``; the task looks an
objective up by ``config.objective`` and calls it, then masks (its own stage, ``mlm_pipeline.masking``).
A new objective is one module here holding an ``OBJECTIVE`` plus one line in ``_BUILT_IN`` below
(or one ``register_objective`` call from anywhere, e.g. a test or a plug-in imported before the
run).

A built-in objective's module is imported when that objective is first asked for, not with this
package nor to list the names (as ``--objective``'s choices): a run imports its own objective's
builder only, not every other one (and the reference modes' tokenizer and file-system imports).

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

import importlib

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

# name -> "module:attribute" of a built-in objective, in registration order (imported on first use)
_BUILT_IN = {
    "nsp": "mlm_pipeline.instances.nsp:OBJECTIVE",
    "packed": "mlm_pipeline.instances.packed:OBJECTIVE",
    "tokens": "mlm_pipeline.instances.tokens:OBJECTIVE",
    "electra": "mlm_pipeline.instances.electra:OBJECTIVE",
    "sop": "mlm_pipeline.instances.sop:OBJECTIVE",
    "sentences": "mlm_pipeline.instances.documents:SENTENCES",
    "documents": "mlm_pipeline.instances.documents:DOCUMENTS",
}
_OBJECTIVES: dict[str, Objective | None] = dict.fromkeys(_BUILT_IN)  # None: a built-in not imported yet


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
    if objective.name in _OBJECTIVES and not replace:
        raise ValueError(f"objective {objective.name!r} is already registered")
    _OBJECTIVES[objective.name] = objective
    return objective


def unregister_objective(name: str) -> None:
    """Remove a registered objective (a test's or plug-in's clean-up); unknown names are ignored."""
    _OBJECTIVES.pop(name, None)


def get_objective(name: str) -> Objective:
    """The objective registered as ``name``; ``ConfigError`` naming the known ones otherwise."""
    try:
        objective = _OBJECTIVES[name]
    except KeyError:
        raise ConfigError(
            f"unknown objective {name!r} (known: {', '.join(objective_names())})"
        ) from None
    if objective is None:
        module, _, attribute = _BUILT_IN[name].partition(":")
        objective = _OBJECTIVES[name] = getattr(importlib.import_module(module), attribute)
    return objective


def objective_names() -> tuple[str, ...]:
    """Registered objective names, in registration order (the built-in ones first)."""
    return tuple(_OBJECTIVES)
