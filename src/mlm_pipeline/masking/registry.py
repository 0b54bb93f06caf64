"""The registry of masking schemes (``--masking-scheme NAME``), as objectives and formats have theirs.

A built-in scheme's module is imported when that scheme is first asked for, so that importing
the package, or listing the names (the run's settings do, for the choices), loads no scheme.
"""

from __future__ import annotations

import importlib
import logging

from mlm_pipeline.errors import ConfigError
from mlm_pipeline.masking.base import MaskingScheme

# name -> module of a built-in scheme (its ``SCHEME``), in registration order (imported on first use)
_BUILT_IN = {
    "token": "mlm_pipeline.masking.token",
    "whole-word": "mlm_pipeline.masking.whole_word",
    "ngram": "mlm_pipeline.masking.ngram",
    "span": "mlm_pipeline.masking.span",
}
_SCHEMES: dict[str, MaskingScheme | None] = dict.fromkeys(_BUILT_IN)  # None: a built-in not imported yet


def register_masking_scheme(scheme: MaskingScheme, *, replace: bool = False) -> MaskingScheme:
    """Make ``scheme`` available as ``--masking-scheme NAME`` (and to the collator); returns it.

    Registering a taken name raises ``ValueError`` unless ``replace`` is set. As with objectives,
    a spawned worker process knows a scheme registered at run time only if the module that
    registers it is imported there too.
    """
    if not isinstance(scheme, MaskingScheme):
        raise TypeError(f"register_masking_scheme takes a MaskingScheme, got {type(scheme).__name__}")
    if not scheme.name or not scheme.name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"masking scheme name must be letters, digits, '-' or '_', got {scheme.name!r}")
    if scheme.name in _SCHEMES and not replace:
        raise ValueError(f"masking scheme {scheme.name!r} is already registered")
    _SCHEMES[scheme.name] = scheme
    return scheme


def unregister_masking_scheme(name: str) -> None:
    """Remove a registered scheme (a test's or plug-in's clean-up); unknown names are ignored."""
    _SCHEMES.pop(name, None)


def get_masking_scheme(name: str) -> MaskingScheme:
    """The scheme registered as ``name``; ``ConfigError`` naming the known ones otherwise."""
    try:
        scheme = _SCHEMES[name]
    except KeyError:
        raise ConfigError(f"unknown masking scheme {name!r} (known: {', '.join(masking_scheme_names())})") from None
    if scheme is None:
        scheme = _SCHEMES[name] = importlib.import_module(_BUILT_IN[name]).SCHEME
    return scheme


def masking_scheme_names() -> tuple[str, ...]:
    """Registered scheme names, in registration order (the built-in ones first)."""
    return tuple(_SCHEMES)


def scheme_record(settings) -> dict:
    """The scheme of a run's settings and the parameters it reads, as the manifest records it."""
    scheme = get_masking_scheme(settings.masking_scheme)
    return {"name": scheme.name, "whole_words": bool(settings.do_whole_word_mask),
            **{name: getattr(settings, name) for name in scheme.parameters}}


def needs_words(settings) -> bool:
    """Whether the run's scheme masks whole words (and so needs the tokenizer's word marker)."""
    return get_masking_scheme(settings.masking_scheme).whole_words != "never" and bool(settings.do_whole_word_mask)


def check_tokenizer(settings, tok) -> None:
    """``ConfigError`` when the scheme masks whole words and the tokenizer marks none."""
    if settings.masking == "static" and needs_words(settings) and tok.word_marker is None:
        raise ConfigError(f"--masking-scheme {settings.masking_scheme} masks whole words, but the tokenizer "
                          f"{settings.tokenizer} marks no word boundaries (no ## continuation pieces, no ▁ or Ġ word "
                          "starts): use --masking-scheme token, or --no-do-whole-word-mask with ngram")


def warn_capped_rate(config) -> None:
    """Warn a run whose masking rate Google's default of 20 predictions caps (30% of 8,192 tokens
    is 2,458), only where the default, not the user, set the cap."""
    wanted = round(config.max_seq_length * config.masked_lm_prob)
    if (config.masking != "static" or "max_predictions_per_seq" in config.model_fields_set
            or wanted <= config.max_predictions_per_seq):
        return
    logging.getLogger("mlm_pipeline").warning(
        "--masked-lm-prob %g of --max-seq-length %d is up to %d masked tokens an instance, but "
        "--max-predictions-per-seq is %d (the default, Google's for 128 tokens): longer instances are masked at "
        "less than %g; pass --max-predictions-per-seq %d for the full rate", config.masked_lm_prob,
        config.max_seq_length, wanted, config.max_predictions_per_seq, config.masked_lm_prob, wanted)
