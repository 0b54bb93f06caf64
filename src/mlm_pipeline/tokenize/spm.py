"""SentencePiece models (``.model`` files): their pieces and roles, ALBERT's text rules, and the
HF conversion.

The ``sentencepiece`` library is the reference for a model's ids (``backends/spm.py`` encodes
with it, and ``auto`` picks it: on English and Chinese text it encoded 2.5-12x faster than the HF
conversion of the same model, one thread each). :func:`to_hf` converts the model to an HF
``tokenizers.Tokenizer``, which the ``hf`` backend encodes with only where it gives the
library's ids (the probe set at load, each task's first block after that). It cannot always:
HF's Unigram breaks ties between segmentations of equal score otherwise (in ``American
Anthropological Association (AAA).`` it gave ``A AA`` where SentencePiece gives ``AA A``).

What a model is decides two things:

* **ALBERT's text rules**: a model holding ``[CLS]`` and ``[SEP]`` pieces (ALBERT's
  ``spiece.model``), or an ALBERT model directory (:func:`directory_model`), is read as HF's ``AlbertTokenizer`` reads it: runs of whitespace made one
  space and the ends stripped (``remove_space``), ```` `` ```` and ``''`` made ``"``, accents
  stripped (NFKD, then combining marks dropped) unless ``keep_accents``, lower-cased when
  ``do_lower_case``, then the model's own normaliser; a piece ending in a digit and a comma is
  encoded again without the comma, as ALBERT does (``1,``: ``1`` ``,``).
  Other models (XLM-R, CamemBERT, T5) encode the text as it is, by their own normaliser.
* **the ids**: a ``.model`` file gives the model's own ids (``sp.encode``). A model directory of
  XLM-R or CamemBERT (:func:`directory_model`) gives fairseq's ids, as their HF
  tokenizers and checkpoints do: XLM-R's ``<s> <pad> </s> <unk>`` first and every other piece one
  id up, CamemBERT's four ids up, ``<mask>`` last.

Roles (cls, sep, mask, pad, unk) are found among the model's pieces (``[CLS]``/``<s>``,
``[SEP]``/``</s>``, ``[MASK]``/``<mask>``, the model's pad and unk ids); a role the model has no
piece for is appended after its pieces (``<s>``, ``</s>``, ``<mask>``, ``<pad>``), as fairseq
appends XLM-R's ``<mask>``: T5's model has no ``<s>`` or mask piece, so its ``<s>`` gets id 32000
and ``<mask>`` id 32001.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlm_pipeline.errors import TokenizerError

MODEL_FILES = ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
"""Names of a SentencePiece model in a Hugging Face model directory (ALBERT and T5; XLM-R and
CamemBERT; others)."""

# SentencePiece piece types (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# a role's names among the pieces, ALBERT's first; APPENDED: the name a missing role gets
ROLE_NAMES = {
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("<pad>", "[PAD]"),
}
APPENDED = {"cls": "<s>", "sep": "</s>", "mask": "<mask>", "pad": "<pad>"}

LAYOUTS = ("own", "xlm-roberta", "camembert")


@dataclass(frozen=True)
class AlbertRules:
    """HF ``AlbertTokenizer``'s preprocessing (``preprocess_text``) and its digit-comma rule."""

    do_lower_case: bool = True
    keep_accents: bool = False
    remove_space: bool = True

    def preprocess(self, text: str) -> str:
        if self.remove_space:
            text = " ".join(text.strip().split())
        text = text.replace("``", '"').replace("''", '"')
        if not self.keep_accents and not text.isascii():
            text = strip_combining(unicodedata.normalize("NFKD", text))
        return text.lower() if self.do_lower_case else text


def strip_combining(text: str) -> str:
    """``text`` without its combining characters (``unicodedata.combining`` not 0), as
    ``AlbertTokenizer`` drops them. Its distinct characters are looked up, not each character
    (a Python loop per character took most of the tokenizer's time on English text)."""
    marks = [c for c in set(text) if unicodedata.combining(c)]
    return text.translate(dict.fromkeys(map(ord, marks))) if marks else text


def ends_in_digit_comma(piece: str) -> bool:
    """ALBERT re-encodes such a piece without its comma (``AlbertTokenizer._tokenize``)."""
    return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


@dataclass
class SpmModel:
    """A SentencePiece model as the pipeline uses it: the file's bytes, and its vocabulary in the
    ids the pipeline writes (``pieces``), with ``id_map`` taking the library's ids there."""

    path: str
    data: bytes
    model_type: str  # unigram, bpe, word, char
    layout: str
    albert: AlbertRules | None
    pieces: list[str]
    scores: list[float]
    emitted: np.ndarray  # bool per id: a piece the library can output (normal, user-defined, byte)
    user_defined: list[str]
    unk_id: int
    roles: dict[str, int]
    appended: list[str] = field(default_factory=list)
    id_map: np.ndarray | None = None  # library id -> pipeline id; None: the same
    normalizer: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def fingerprint(self) -> str:
        """sha256 of the model's bytes and of how the pipeline reads it."""
        how = {"layout": self.layout, "appended": self.appended,
               "albert": None if self.albert is None else vars(self.albert)}
        return hashlib.sha256(self.data + json.dumps(how, sort_keys=True).encode()).hexdigest()


def _proto(data: bytes, path: str):
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as exc:  # pragma: no cover - base dependencies
        raise TokenizerError(f"reading the SentencePiece model {path} needs the sentencepiece and protobuf "
                             f"packages ({exc}); pip install sentencepiece protobuf") from None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError differs between implementations
        raise TokenizerError(f"{path} is not a SentencePiece model: {exc}") from None
    if not proto.pieces:
        raise TokenizerError(f"{path} is not a SentencePiece model (no pieces)")
    return proto


_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def read_model(path: str, *, layout: str = "own", albert: AlbertRules | None = None,
               do_lower_case: bool = True) -> SpmModel:
    """The model at ``path``. ``albert``: ALBERT's rules as a model directory gives them; None:
    ALBERT's with ``do_lower_case`` (and accents stripped) when the model holds ``[CLS]`` and
    ``[SEP]`` pieces, else none."""
    if layout not in LAYOUTS:
        raise TokenizerError(f"unknown SentencePiece id layout {layout!r}")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TokenizerError(f"cannot read SentencePiece model {path}: {exc}") from None
    proto = _proto(data, path)
    model_type = _MODEL_TYPES.get(proto.trainer_spec.model_type, str(proto.trainer_spec.model_type))
    names = [p.piece for p in proto.pieces]
    types = [p.type for p in proto.pieces]
    scores = [float(p.score) for p in proto.pieces]
    if albert is None and "[CLS]" in names and "[SEP]" in names:
        albert = AlbertRules(do_lower_case=do_lower_case)
    unk = proto.trainer_spec.unk_id
    id_map = None
    if layout == "own":
        pieces, piece_scores, emitted = list(names), list(scores), [t in (NORMAL, USER_DEFINED, BYTE) for t in types]
    else:
        # XLM-R: <s> <pad> </s> <unk> then pieces[3:] (library id i -> i + 1); CamemBERT:
        # <s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED then pieces[1:] (i -> i + 4); <mask> last
        head, first = ((["<s>", "<pad>", "</s>", "<unk>"], 3) if layout == "xlm-roberta" else
                       (["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED"], 1))
        expected = ["<unk>", "<s>", "</s>"][:first]
        if names[:first] != expected or unk != 0:
            raise TokenizerError(f"{path} does not start with {' '.join(expected)} (unk id 0), as a {layout} "
                                 f"SentencePiece model does: its first pieces are {' '.join(names[:3])}")
        offset = len(head) - first
        pieces = head + names[first:] + ["<mask>"]
        piece_scores = [0.0] * len(head) + scores[first:] + [0.0]
        emitted = [False] * len(head) + [t in (NORMAL, USER_DEFINED, BYTE) for t in types[first:]] + [False]
        id_map = np.arange(len(names), dtype=np.int64) + offset
        id_map[0] = 3  # <unk>
        if layout == "xlm-roberta":
            id_map[1], id_map[2] = 0, 2  # <s>, </s>
        unk = 3
    roles: dict[str, int] = {}
    ids = {p: i for i, p in enumerate(pieces) if not emitted[i]}  # roles are pieces text never gives
    for role, candidates in ROLE_NAMES.items():
        found = next((ids[n] for n in candidates if n in ids), None)
        if found is None and layout == "own":
            spec = {"cls": proto.trainer_spec.bos_id, "sep": proto.trainer_spec.eos_id,
                    "pad": proto.trainer_spec.pad_id}.get(role, -1)
            found = spec if 0 <= spec < len(pieces) else None
        if found is not None:
            roles[role] = found
    appended = []
    for role in ("cls", "sep", "mask", "pad"):
        if role not in roles:
            name = APPENDED[role]
            while name in pieces:  # a normal piece of that name: pick another
                name = f"<{name.strip('<>/')}_{len(pieces)}>"
            roles[role] = len(pieces)
            pieces.append(name)
            piece_scores.append(0.0)
            emitted.append(False)
            appended.append(name)
    roles["unk"] = unk
    spec = proto.normalizer_spec
    normalizer = {"precompiled_charsmap": bytes(spec.precompiled_charsmap),
                  "add_dummy_prefix": spec.add_dummy_prefix,
                  "remove_extra_whitespaces": spec.remove_extra_whitespaces,
                  "escape_whitespaces": spec.escape_whitespaces,
                  "treat_whitespace_as_suffix": proto.trainer_spec.treat_whitespace_as_suffix,
                  "byte_fallback": proto.trainer_spec.byte_fallback}
    user = [n for n, t in zip(names, types) if t == USER_DEFINED]
    return SpmModel(path=path, data=data, model_type=model_type, layout=layout, albert=albert, pieces=pieces,
                    scores=piece_scores, emitted=np.array(emitted, dtype=bool), user_defined=user, unk_id=unk,
                    roles=roles, appended=appended, id_map=id_map, normalizer=normalizer)


MODEL_TYPES = {"albert": "Albert", "xlm-roberta": "XLMRoberta", "camembert": "Camembert", "t5": "T5", "mt5": "MT5"}
"""A model directory's ``config.json`` ``model_type``, for the tokenizer class its
``tokenizer_config.json`` does not name (older hub repositories name none)."""


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from exc
    return found if isinstance(found, dict) else {}


def directory_model(directory: Path, do_lower_case: bool) -> tuple[str, str, AlbertRules | None] | None:
    """The SentencePiece model of a Hugging Face model directory of ALBERT, XLM-R, CamemBERT or T5
    (``tokenizer_config.json``'s ``tokenizer_class``, else ``config.json``'s ``model_type``) as
    (path, id layout, ALBERT's rules), or None: such a directory is read by its model file,
    checked against the library, rather than by its ``tokenizer.json``."""
    model = next((directory / n for n in MODEL_FILES if (directory / n).is_file()), None)
    if model is None:
        return None
    settings = _json(directory / "tokenizer_config.json")
    cls = str(settings.get("tokenizer_class") or MODEL_TYPES.get(_json(directory / "config.json").get("model_type"), ""))
    if cls.startswith("Albert"):
        rules = AlbertRules(do_lower_case=bool(settings.get("do_lower_case", do_lower_case)),
                            keep_accents=bool(settings.get("keep_accents", False)),
                            remove_space=bool(settings.get("remove_space", True)))
        return str(model), "own", rules
    if cls.startswith("XLMRoberta"):
        return str(model), "xlm-roberta", None
    if cls.startswith("Camembert"):
        return str(model), "camembert", None
    if cls.startswith(("T5", "MT5")):
        return str(model), "own", None
    return None


NEVER = "\ufffe{}\uffff"
"""The name a piece the library never outputs (control, unknown, unused, appended) has in the HF
conversion's vocabulary: text cannot reach it there, as it cannot in SentencePiece (HF's Unigram
would otherwise match ``<s>`` or ``[CLS]`` in the text)."""


def to_hf(model: SpmModel):
    """The HF ``tokenizers.Tokenizer`` that encodes as the library does, as far as HF can.

    No ALBERT rules in it: :class:`~mlm_pipeline.tokenize.loading.TextTokenizer` applies them
    before any backend, so the conversion and the library see the same text.
    """
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    if model.model_type != "unigram":
        raise TokenizerError(f"{model.path}: the HF conversion covers unigram SentencePiece models; this one is "
                             f"{model.model_type} (the sentencepiece backend encodes it)")
    norm = model.normalizer
    if norm["treat_whitespace_as_suffix"]:
        raise TokenizerError(f"{model.path}: the HF conversion does not cover treat_whitespace_as_suffix")
    vocab = [(p if model.emitted[i] else NEVER.format(i), s) for i, (p, s) in enumerate(zip(model.pieces, model.scores))]
    tok = Tokenizer(models.Unigram(vocab, unk_id=model.unk_id, byte_fallback=norm["byte_fallback"]))
    steps = []
    if norm["precompiled_charsmap"]:
        steps.append(normalizers.Precompiled(norm["precompiled_charsmap"]))
    if norm["remove_extra_whitespaces"]:  # spaces only: SentencePiece keeps other whitespace
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if norm["escape_whitespaces"]:
        steps.append(normalizers.Replace(" ", "▁"))
    if norm["add_dummy_prefix"]:
        # SentencePiece prefixes ▁ even to a text that starts with one; Metaspace does not
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    tok.normalizer = normalizers.Sequence(steps)
    pre = []
    if norm["add_dummy_prefix"]:
        pre.append(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False))
    if model.user_defined:  # SentencePiece outputs a user-defined piece whole, wherever it occurs
        pattern = "|".join(re.escape(p) for p in sorted(model.user_defined, key=len, reverse=True))
        pre.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if pre:
        tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    return tok


def continuation_table(model: SpmModel) -> np.ndarray:
    """Per id, whether it continues a word: an output piece without the word-start marker ``▁``
    (pieces text never gives, and user-defined ones, which stand whole, continue nothing)."""
    user = set(model.user_defined)
    return np.array([bool(model.emitted[i]) and not p.startswith("▁") and p not in user
                     for i, p in enumerate(model.pieces)], dtype=bool)
