"""Tokenizer loading and batched encoding to flat numpy arrays (HF ``tokenizers``, Rust).

Accepts a WordPiece ``vocab.txt`` (Google's BERT format), a ``tokenizer.json``, a SentencePiece
``.model`` (``spm.py``), a local Hugging Face model directory holding any of them, or a hub model
name (``bert-base-uncased``: see ``hub.py``). Truncation and padding stored in a
``tokenizer.json`` are switched off: instance building decides lengths, not the tokenizer.

Two flavors of text normalization: ``bert`` (HF's ``BertNormalizer`` and ``BertPreTokenizer``, as
stored or as ``BertWordPieceTokenizer`` builds them) and ``electra`` (google-research/electra's
``FullTokenizer`` rules over the same WordPiece vocabulary; see ``tokenize/google_rules.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models
from tokenizers.implementations import BertWordPieceTokenizer

from mlm_pipeline.environment import configure_process
from mlm_pipeline.errors import ConfigError, TokenizerError
from mlm_pipeline.tokenize import spm
from mlm_pipeline.tokenize.backends import BACKENDS, HFEncoder, backend_names
from mlm_pipeline.tokenize.backends.spm import SentencePieceEncoder
from mlm_pipeline.tokenize.hub import hub_tokenizer_dir, looks_like_hub_name
from mlm_pipeline.tokenize.google_rules import (
    TOKENIZER_FLAVORS,
    electra_in_python,
    electra_tokenizer,
    read_google_vocab,
)
from mlm_pipeline.tokenize.long_texts import encode_cut
from mlm_pipeline.tokenize.not_a_tokenizer import WHAT_A_TOKENIZER_IS, not_a_tokenizer_json, not_a_vocab
from mlm_pipeline.tokenize.selfcheck import (PROBES, UnsupportedConfiguration, first_difference, first_failure,
                                             probes_for)
from mlm_pipeline.tokenize.unknown_words import unknown_words

log = logging.getLogger("mlm_pipeline")

# Names of the special tokens, BERT first, then RoBERTa/XLM-R style.
_SPECIALS = {
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
}


def _resolve(path: str, do_lower_case: bool, flavor: str = "bert",
             strip_accents: bool | None = None) -> tuple[Tokenizer, str, tuple[bool, bool] | None]:
    """The HF tokenizer at ``path``, its kind, and for the ``electra`` flavor whether it lower-cases
    and strips accents: a ``tokenizer.json``'s own ``BertNormalizer`` says so (as it does for the
    ``bert`` flavor), a model directory's ``tokenizer_config.json`` for its ``vocab.txt``
    (``do_lower_case``, ``strip_accents``: HF's names), else ``do_lower_case``."""
    p = Path(path)
    if not p.exists():
        if looks_like_hub_name(path):  # bert-base-uncased: from the HF cache, or the hub
            return _resolve(hub_tokenizer_dir(path), do_lower_case, flavor)
        raise TokenizerError(f"tokenizer path does not exist: {path}")
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return _resolve(str(p / "tokenizer.json"), do_lower_case, flavor)
        if (p / "vocab.txt").is_file():
            cfg = p / "tokenizer_config.json"
            if cfg.is_file():
                try:
                    settings = json.loads(cfg.read_text())
                except (json.JSONDecodeError, OSError) as exc:
                    raise TokenizerError(f"cannot read {cfg}: {exc}") from exc
                do_lower_case = bool(settings.get("do_lower_case", do_lower_case))
                if settings.get("strip_accents") is not None:
                    strip_accents = bool(settings["strip_accents"])
            return _resolve(str(p / "vocab.txt"), do_lower_case, flavor, strip_accents)
        raise TokenizerError(f"{path} is a directory without tokenizer.json, vocab.txt or a SentencePiece model "
                             f"({', '.join(spm.MODEL_FILES)})")
    if p.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # tokenizers raises a plain Exception on bad JSON
            raise TokenizerError(f"{not_a_tokenizer_json(path, exc)}; {WHAT_A_TOKENIZER_IS}") from exc
        if flavor == "electra":
            if type(tok.model).__name__ != "WordPiece":
                raise TokenizerError(
                    f"tokenizer flavor 'electra' needs a WordPiece vocabulary; {path} holds a "
                    f"{type(tok.model).__name__} model"
                )
            norm = json.loads(tok.to_str()).get("normalizer") or {}
            if norm.get("type") == "BertNormalizer":  # its own case and accents, as for the bert flavor
                do_lower_case = bool(norm.get("lowercase"))
                strip_accents = None if norm.get("strip_accents") is None else bool(norm["strip_accents"])
            return _electra(tok.get_vocab(with_added_tokens=False), do_lower_case, strip_accents, "tokenizer.json")
        return tok, "tokenizer.json", None
    if flavor == "electra":
        try:
            return _electra(read_google_vocab(str(p)), do_lower_case, strip_accents, "wordpiece-vocab")
        except TokenizerError as exc:  # (no [UNK]: say what the file is)
            raise TokenizerError(f"{exc}: {not_a_vocab(path)}; {WHAT_A_TOKENIZER_IS}") from exc
    try:
        tok = BertWordPieceTokenizer(str(p), lowercase=do_lower_case, strip_accents=strip_accents)._tokenizer
    except Exception as exc:  # HF's words: "sep_token not found in the vocabulary"
        raise TokenizerError(f"cannot load {path} as a WordPiece vocab: {not_a_vocab(path)}; "
                             f"{WHAT_A_TOKENIZER_IS}") from exc
    return tok, "wordpiece-vocab", None


def _local(path: str) -> str:
    """``path``, or for a hub name that is not a local path the directory of its cached files."""
    if not Path(path).exists() and looks_like_hub_name(path):  # bert-base-uncased: from the HF cache, or the hub
        return hub_tokenizer_dir(path)
    return path


def _sentencepiece(path: str, do_lower_case: bool, flavor: str) -> spm.SpmModel | None:
    """The SentencePiece model ``path`` names, or None: a ``.model`` file, a model directory of
    ALBERT, XLM-R, CamemBERT or T5 (``spm.directory_model``: read by its model file, checked
    against the library, rather than by its ``tokenizer.json``), or one with a model file and
    neither ``tokenizer.json`` nor ``vocab.txt``."""
    p = Path(path)
    found = None
    if p.is_file() and p.suffix == ".model":
        found = (str(p), "own", None)
    elif p.is_dir():
        found = spm.directory_model(p, do_lower_case)
        model = next((p / n for n in spm.MODEL_FILES if (p / n).is_file()), None)
        if found is None and model is not None and not (p / "tokenizer.json").is_file() \
                and not (p / "vocab.txt").is_file():
            found = (str(model), "own", None)
    if found is None:
        return None
    if flavor == "electra":
        raise TokenizerError(f"tokenizer flavor 'electra' needs a WordPiece vocabulary; {path} is a SentencePiece "
                             "model")
    model_path, layout, rules = found
    return spm.read_model(model_path, layout=layout, albert=rules, do_lower_case=do_lower_case)


def model_type_of(tok: Tokenizer) -> str:
    """``wordpiece``, ``sentencepiece`` (a Unigram model, or BPE with ``▁`` word starts),
    ``byte-level-bpe`` (``Ġ`` word starts) or ``bpe`` (other)."""
    name = type(tok.model).__name__
    if name == "WordPiece":
        return "wordpiece"
    if name == "Unigram":
        return "sentencepiece"
    # the components' own JSON (the whole tokenizer's took 0.2 s for a 50k BPE vocabulary)
    parts = b" ".join(c.__getstate__() for c in (tok.pre_tokenizer, tok.normalizer, tok.decoder) if c is not None)
    if b'"ByteLevel"' in parts:
        return "byte-level-bpe"
    if b'"Metaspace"' in parts or "\u2581".encode() in parts or b"\\u2581" in parts:
        return "sentencepiece"
    return "bpe"


def _electra(vocab: dict[str, int], lowercase: bool, strip_accents: bool | None,
             kind: str) -> tuple[Tokenizer, str, tuple[bool, bool]]:
    """:func:`_resolve`'s answer for the ``electra`` flavor (``strip_accents`` None: as lower-casing)."""
    strip = strip_accents is not False
    return electra_tokenizer(vocab, lowercase, strip), kind, (lowercase, lowercase and strip)


def _component_types(component) -> set[str]:
    """The ``type`` names of a pre-tokenizer or decoder, those inside a ``Sequence`` included."""
    if component is None:
        return set()
    try:
        spec = json.loads(component.__getstate__())
    except Exception:  # (not a serialisable component)
        return {type(component).__name__}
    found, todo = set(), [spec]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            found.add(str(item.get("type")))
            todo.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            todo.extend(item)
    return found


def word_marker(tok: Tokenizer) -> tuple[str, str] | None:
    """How this tokenizer marks words, from its model and pre-tokenizer (not guessed from
    tokens): ``("continuation", prefix)`` (WordPiece's ``##``, or a BPE's continuing-subword
    prefix), ``("start", marker)`` (byte-level BPE's ``Ġ``, SentencePiece's ``▁``), or None
    (no word boundaries it marks: whole-word masking is refused)."""
    model = tok.model
    kind = type(model).__name__
    prefix = getattr(model, "continuing_subword_prefix", None)
    if kind == "WordPiece":
        return "continuation", prefix or "##"
    types = _component_types(tok.pre_tokenizer) | _component_types(tok.decoder)
    if "ByteLevel" in types:
        return "start", "Ġ"
    if "Metaspace" in types or kind == "Unigram":
        replacement = getattr(tok.pre_tokenizer, "replacement", None)
        return "start", replacement if isinstance(replacement, str) and replacement else "▁"
    if kind == "BPE" and prefix:
        return "continuation", prefix
    return None


def _continuation_table(tok: Tokenizer) -> np.ndarray:
    """``True`` for vocabulary entries that continue a word (used by the whole-word schemes), by
    the tokenizer's own marker (:func:`word_marker`): WordPiece marks continuations with a
    prefix (``##``); byte-level BPE and SentencePiece mark word *starts* (``Ġ``, ``▁``), so
    there a token without the marker continues a word. Added tokens (``<s>``, ``[MASK]``...)
    never continue one; with no marker, no token does.
    """
    # by id (HF's get_vocab builds a dict: 0.5 s of a 250k vocabulary's 0.9 s); a vocabulary with
    # a hole in its ids, or one past the count, by get_vocab
    size = tok.get_vocab_size(with_added_tokens=True)
    strings = list(map(tok.id_to_token, range(size)))
    if None in strings or tok.id_to_token(size) is not None:
        vocab = tok.get_vocab(with_added_tokens=True)
        size, tokens = max(vocab.values()) + 1, vocab.items()  # ids are unique: no need to sort
    else:
        tokens = zip(strings, range(size))
    table = np.zeros(size, dtype=bool)
    marker = word_marker(tok)
    if marker is None:
        return table
    tokens = list(tokens)
    how, mark = marker
    if how == "continuation":
        flags = [t.startswith(mark) and len(t) > len(mark) for t, _ in tokens]
    else:
        flags = [not t.startswith(mark) and not (t.startswith("<") and t.endswith(">")) for t, _ in tokens]
    table[np.fromiter((i for _, i in tokens), dtype=np.int64, count=len(tokens))] = flags
    added = [i for i in tok.get_added_tokens_decoder()] if hasattr(tok, "get_added_tokens_decoder") else []
    table[np.asarray(added, dtype=np.int64)] = False
    return table


CASED_VOCAB_SHARE = 0.01
"""A WordPiece vocabulary with more than this share of entries holding an upper-case letter is
cased (bert-base-cased: 20%; bert-base-uncased: none but its [CLS]-style specials)."""


def case_mismatch(tok: "TextTokenizer", *, lower_off: str = "--no-do-lower-case") -> str | None:
    """Why ``do_lower_case`` does not fit a vocab.txt, or None: Google's classic mistake, an
    uncased vocabulary read without lower-casing (every capitalised word turns into [UNK] or
    pieces), or a cased one lower-cased (its upper-case entries never used). ``lower_off``: how
    the user writes "do not lower-case" (``--do_lower_case=False`` on Google's command line)."""
    if tok.kind != "wordpiece-vocab":
        return None  # a tokenizer.json or model directory says itself how it normalises
    # 2,000 entries spread over the vocabulary tell (reading all of it took 10 ms of the start-up)
    size = tok.vocab_size
    words = [t for t in map(tok.tokenizer.id_to_token, range(0, size, max(1, size // 2000)))
             if t is not None and not (t.startswith("[") and t.endswith("]"))]
    cased = sum(t != t.lower() for t in words) > CASED_VOCAB_SHARE * max(1, len(words))
    lower = tok.lowercases
    if cased and lower:
        return f"the vocabulary is cased (it holds upper-case entries) but the text is lower-cased: {lower_off} uses them"
    if not cased and not lower:
        off = lower_off
        return (f"the vocabulary is uncased (no upper-case entries) but {off} keeps the text's case: capitalised "
                f"words become [UNK] or pieces; drop {off}")
    return None


def missing_unk_message(path: str, unk: str, what: str) -> str:
    """What a run says of a WordPiece vocabulary without its unknown token (``what``: what happens)."""
    return f"tokenizer {path} has no {unk} token: {what}; add a line {unk} to the vocabulary"


_MISSING_UNK = re.compile(r"Missing (\S+) token from the vocabulary")


def unspellable_word_error(exc: BaseException, path: str) -> TokenizerError | None:
    """HF's failure on a word a vocabulary without its unknown token cannot spell, as an error
    naming the tokenizer and the fix (HF's own names neither), or None for any other error."""
    found = _MISSING_UNK.search(str(exc))
    if found is None or isinstance(exc, TokenizerError):
        return None
    return TokenizerError(missing_unk_message(path, found.group(1), "a text holds a word its vocabulary cannot spell"))


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    pad: int


class TextTokenizer:
    """A loaded tokenizer plus what instance building and masking need from it."""

    def __init__(self, path: str, *, do_lower_case: bool = True, flavor: str = "bert", backend: str = "auto"):
        if flavor not in TOKENIZER_FLAVORS:
            raise TokenizerError(f"unknown tokenizer flavor {flavor!r} (choose {' or '.join(TOKENIZER_FLAVORS)})")
        local = _local(path)
        model = _sentencepiece(local, do_lower_case, flavor)
        if model is not None:
            self._init_sentencepiece(path, model, do_lower_case, flavor, backend)
            return
        tok, kind, electra_case = _resolve(local, do_lower_case, flavor)
        tok.no_truncation()
        tok.no_padding()
        self.path = path
        self.kind = kind
        self.model_type = model_type_of(tok)
        self.sentencepiece: spm.SpmModel | None = None
        self._albert: spm.AlbertRules | None = None
        self.do_lower_case = do_lower_case
        self.flavor = flavor
        # ELECTRA lower-cases a capital sigma by context, which HF's Lowercase cannot, and orders
        # marks by Python's combining classes (google_rules.electra_in_python)
        self._lower_in_python = electra_case is not None and electra_case[0]
        self._strip_accents = electra_case is None or electra_case[1]
        # what the tokenizer does: a model directory's tokenizer_config.json may have overridden the flag
        self.lowercases = electra_case[0] if electra_case is not None else \
            bool(getattr(tok.normalizer, "lowercase", do_lower_case))
        self.tokenizer = tok
        ids = {}
        for role, names in _SPECIALS.items():
            for name in names:
                tid = tok.token_to_id(name)
                if tid is not None:
                    ids[role] = tid
                    break
        missing = [r for r in ("cls", "sep", "mask") if r not in ids]
        if missing:
            what = f"; {not_a_vocab(local)}" if kind == "wordpiece-vocab" else ""
            raise TokenizerError(
                f"tokenizer {path} has no token for {', '.join(missing)} "
                f"(looked for {', '.join(n for r in missing for n in _SPECIALS[r])}){what}; {WHAT_A_TOKENIZER_IS}"
            )
        unk = getattr(tok.model, "unk_token", None) if isinstance(tok.model, models.WordPiece) else None
        # a WordPiece vocabulary without its unknown token: the first word it cannot spell fails
        # the task, as Google's script stops there (a KeyError); warned about at a run's start
        self.missing_unk: str | None = unk if unk is not None and tok.token_to_id(unk) is None else None
        self.special = SpecialIds(cls=ids["cls"], sep=ids["sep"], mask=ids["mask"], pad=ids.get("pad", 0))
        self.unk_id: int | None = ids.get("unk")
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.special_id_array = np.array(sorted(set(ids.values())), dtype=np.int32)
        self.checked = CheckedEncoder(tok, backend, model_type=self.model_type)

    def _init_sentencepiece(self, path: str, model: spm.SpmModel, do_lower_case: bool, flavor: str,
                            backend: str) -> None:
        """A SentencePiece model: encoded by the ``sentencepiece`` library (the reference) or by
        HF's conversion where that gives the same ids; roles from the model (``spm.py``)."""
        self.path = path
        self.kind = "sentencepiece-model"
        self.model_type = "sentencepiece"
        self.sentencepiece = model
        self._albert = model.albert
        self.do_lower_case = do_lower_case
        self.flavor = flavor
        self._lower_in_python = False
        self._strip_accents = True
        self.lowercases = model.albert is not None and model.albert.do_lower_case
        try:
            tok = spm.to_hf(model)
        except TokenizerError as exc:  # a BPE model: the library only
            log.info("%s", exc)
            tok = None
        self.tokenizer = tok
        self._pieces = model.pieces
        roles = model.roles
        self.missing_unk = None
        self.special = SpecialIds(cls=roles["cls"], sep=roles["sep"], mask=roles["mask"], pad=roles["pad"])
        self.unk_id = roles["unk"]
        self.vocab_size = model.vocab_size
        self.special_id_array = np.array(sorted(set(roles.values())), dtype=np.int32)
        if model.appended:
            log.warning("SentencePiece model %s has no piece for %s: appended after its %d pieces as id %s (a "
                        "model trained on these shards needs %d embeddings)", model.path, ", ".join(model.appended),
                        model.vocab_size - len(model.appended),
                        ", ".join(str(model.vocab_size - len(model.appended) + i) for i in range(len(model.appended))),
                        model.vocab_size)
        self.checked = CheckedEncoder(tok, backend, reference=SentencePieceEncoder.from_model(model),
                                      model_type=self.model_type)

    @functools.cached_property
    def is_continuation(self) -> np.ndarray:
        """Per id, whether it continues a word: for whole-word masking only, so built on first
        use (a Python pass over the vocabulary, about 30 ms)."""
        if self.sentencepiece is not None:
            return spm.continuation_table(self.sentencepiece)
        return _continuation_table(self.tokenizer)

    @functools.cached_property
    def word_marker(self) -> tuple[str, str] | None:
        """How the tokenizer marks words (:func:`word_marker`): ``("continuation", "##")``,
        ``("start", "▁")``, ``("start", "Ġ")``...; None: it marks none."""
        if self.sentencepiece is not None:
            return "start", "\u2581"
        return word_marker(self.tokenizer)

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer (vocab, normaliser, lower-casing...); of a
        SentencePiece model, of its bytes and how it is read (``SpmModel.fingerprint``)."""
        if self.sentencepiece is not None:
            return self.sentencepiece.fingerprint()
        return hashlib.sha256(self.tokenizer.to_str().encode("utf-8")).hexdigest()

    @property
    def encoder(self):
        """The backend that encodes (after any fallback)."""
        return self.checked.encoder

    @property
    def reference(self) -> HFEncoder:
        return self.checked.reference

    @property
    def backend_info(self) -> dict:
        return self.checked.info

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of many texts as one flat int32 array plus per-text lengths (no specials).
        A text over ``LONG_TEXT_CHARS`` is encoded in pieces (``long_texts``), so memory stays
        bounded whatever a line holds."""
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        return encode_cut(self.checked.encode_batch, self._preprocess(texts))

    def _preprocess(self, texts: list[str]) -> list[str]:
        """What the text rules do in Python before any backend: ELECTRA's case and accents,
        ALBERT's ``preprocess_text``."""
        if self._lower_in_python:
            return [t if t.isascii() else electra_in_python(t, self._strip_accents) for t in texts]
        if self._albert is not None:
            return list(map(self._albert.preprocess, texts))
        return texts

    def begin_task(self) -> None:
        """A task starts: the backend chosen at load encodes again (:meth:`CheckedEncoder.begin_task`)."""
        self.checked.begin_task()

    def check_block(self, texts: list[str], where: str) -> None:
        """Compare the backend with the reference (HF, or the sentencepiece library) on real input;
        on a difference use the reference for the rest of the task."""
        self.checked.check_block(self._preprocess(texts), where)

    def unknown_text(self) -> str | None:
        """Text that encodes to the unknown token, for a reader to write where its input marks a
        word as unknown (WikiText's ``<unk>``): the unknown token's own string where the tokenizer
        matches it as a special token (HF's BERT normalization), else a symbol no vocabulary
        spells (ELECTRA's rules split ``[UNK]`` into pieces and drop private-use characters); a
        SentencePiece model may put its word-start piece before it, as for any unknown word.
        None when none encodes so (a byte-level BPE has no unknown token)."""
        if self.unk_id is None:
            return None
        for text in (self.convert_ids_to_tokens([self.unk_id])[0], "\u2370", "\U0002a6d6"):
            ids = self.encode_batch([text])[0].tolist()
            if ids == [self.unk_id] or (len(ids) == 2 and ids[1] == self.unk_id
                                        and self.convert_ids_to_tokens(ids[:1])[0] in ("\u2581", "\u0120")):
                return text
        return None

    def unknown_words(self, texts: list[str]) -> list[str]:
        """The words of ``texts`` that encode to the unknown token (:func:`.unknown_words.unknown_words`)."""
        return unknown_words(self, texts)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        if self.sentencepiece is not None:
            n = len(self._pieces)
            return [self._pieces[int(i)] if 0 <= int(i) < n else f"<{int(i)}>" for i in ids]
        return [self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]


def _info(encoder) -> dict:
    return {"backend": encoder.name, "version": encoder.version()}


class CheckedEncoder:
    """The fastest backend that gives the reference's ids for one tokenizer, and the guard that
    keeps it so. The reference is HF, or for a SentencePiece model the ``sentencepiece`` library
    (``reference``), with HF's conversion of the model (``tok``, None where there is none) a
    candidate like any other.

    At construction each candidate must encode the probes of the tokenizer's model type
    (``selfcheck.probes_for``; the generic ``PROBES`` against the sentencepiece library) exactly
    as the reference does; ``check_block`` compares it with the reference again on real input (each
    task's first texts). On any difference the reference encodes for the rest of that task
    (``begin_task`` starts the next one with the backend chosen at load), with a warning naming
    the text, and ``info`` (what the task marker and the manifest record) says so.
    """

    def __init__(self, tok: Tokenizer | None, requested: str = "auto", reference=None,
                 model_type: str | None = None):
        if reference is None:
            self.reference = HFEncoder(tok)
            # the checks compare with the HF tokenizer as it is (no ASCII route: their few texts
            # gain nothing from it)
            self._plain = HFEncoder(tok, ascii_route=False)
        else:
            self.reference = self._plain = reference
        # a model type's own probes are checks against HF; against the sentencepiece library its
        # HF conversion is known to break ties otherwise (spm.py) and meets the generic set only
        probes = PROBES if reference is not None else probes_for(model_type or (model_type_of(tok) if tok else None))
        self.encoder, self.info = _choose_backend(tok, self.reference, requested, self._plain, probes)
        if self.reference.name != HFEncoder.name:  # what a run re-encodes with after a fallback (pipeline.py)
            self.info["reference"] = self.reference.name
        self._chosen = (self.encoder, self.info)

    def begin_task(self) -> None:
        """Encode with the backend chosen at load again. A fallback (:meth:`check_block`) holds
        for the rest of the task whose text showed the difference, not for the tasks this process
        runs after it: their bytes would otherwise depend on what ran before them in the same
        process, and so on the worker count."""
        self.encoder, self.info = self._chosen

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self.encoder.encode_batch(texts)
        except Exception as exc:  # a text past the checks the backend cannot encode: the reference's turn
            if self.encoder is self.reference:
                raise
            self._fall_back(f"{type(exc).__name__} ({str(exc)[:200]}) on text "
                            f"{texts[first_failure(texts, self.encoder)][:200]!r}")
            return self.reference.encode_batch(texts)

    def check_block(self, texts: list[str], where: str) -> None:
        if self.encoder is self.reference or not texts:
            return
        i = first_difference(texts, self.encoder, self._plain)
        if i is not None:
            self._fall_back(f"{where}: ids differ from {_label(self.reference)} on text {texts[i][:200]!r}")

    def _fall_back(self, reason: str) -> None:
        log.warning("tokenizer backend %s falls back to %s: %s", self.encoder.name, self.reference.name, reason)
        self.info = {**_info(self.reference), "requested": self.info["requested"],
                     "fallback_from": self.encoder.name, "fallback_reason": reason,
                     **({"reference": self.info["reference"]} if "reference" in self.info else {})}
        self.encoder = self.reference


def _label(reference) -> str:
    return "HF" if reference.name == HFEncoder.name else reference.name


def _choose_backend(tok: Tokenizer | None, reference, requested: str, plain,
                    probes: tuple[str, ...]) -> tuple[object, dict]:
    """The encoder to use and what to record about it (``auto``: the fastest that is exact, as
    ``plain``, the reference as it is, encodes ``probes``)."""
    if requested not in backend_names():
        raise ConfigError(f"unknown tokenizer backend {requested!r}; choose one of {', '.join(backend_names())}")
    reasons, refused = {}, False
    for name in (BACKENDS if requested == "auto" else [requested]):
        if name == reference.name:
            break
        if requested == "auto" and not getattr(BACKENDS[name], "from_hf", True):
            continue  # built from another kind of tokenizer (a SentencePiece model): not this one
        try:
            if tok is None:
                raise ValueError("no HF conversion of this tokenizer")
            encoder = BACKENDS[name](tok)
        except Exception as exc:  # library missing, or a configuration it does not implement
            reasons[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            refused |= isinstance(exc, UnsupportedConfiguration)
            continue
        i = first_difference(list(probes), encoder, plain)
        if i is None:
            return encoder, {**_info(encoder), "requested": requested}
        reasons[name] = f"self-check: ids differ from {_label(reference)} on probe {probes[i][:80]!r}"
    info = {**_info(reference), "requested": requested}
    if reasons:
        info["fallback_reason"] = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        # a difference from HF, or a backend asked for by name, is news; in auto mode a backend
        # that is not installed or does not implement this tokenizer (BPE, ELECTRA's rules) is not:
        # the manifest records it (tokenizer_backend), and -v does not repeat it at every load
        checked = refused or any("self-check" in r for r in reasons.values())
        log.log(logging.WARNING if requested != "auto" or checked else logging.DEBUG,
                "tokenizer backend falls back to %s: %s", reference.name, info["fallback_reason"])
    return reference, info


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, do_lower_case: bool = True, flavor: str = "bert", backend: str = "auto") -> TextTokenizer:
    """Per-process cache: each worker loads the tokenizer once, never pickled from the parent.

    ``flavor``: ``"bert"`` (HF's BERT normalization) or ``"electra"`` (ELECTRA's rules);
    ``backend``: which encoder (``auto``: the fastest exact one; the output never depends on it).
    """
    configure_process()
    return TextTokenizer(path, do_lower_case=do_lower_case, flavor=flavor, backend=backend)
