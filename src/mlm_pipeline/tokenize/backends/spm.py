"""The ``sentencepiece`` library (Google's, C++) encoding a SentencePiece model: the reference for
the ids of a ``.model``, and its fastest encoder (``auto`` picks it; see ``tokenize/spm.py``).

It is built from the :class:`~mlm_pipeline.tokenize.spm.SpmModel`, not from an HF tokenizer, so
for a WordPiece or BPE tokenizer it does not apply. It encodes on the calling thread
(``num_threads=1``): the pipeline's parallelism is its worker processes.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.tokenize.spm import ends_in_digit_comma


class SentencePieceEncoder:
    name = "sentencepiece"
    from_hf = False  # built from a SentencePiece model (``from_model``), not from an HF tokenizer

    def __init__(self, tokenizer=None):
        raise ValueError("the sentencepiece backend encodes SentencePiece .model tokenizers only")

    @classmethod
    def from_model(cls, model) -> "SentencePieceEncoder":
        from sentencepiece import SentencePieceProcessor

        self = cls.__new__(cls)
        self._sp = SentencePieceProcessor(model_proto=model.data)
        self._id_map = model.id_map
        self._albert = model.albert is not None
        # ALBERT's digit-comma rule: ids of pieces ending in a digit and a comma (none in most models)
        self._digit_comma = np.array([model.albert is not None and ends_in_digit_comma(self._sp.id_to_piece(i))
                                      for i in range(self._sp.get_piece_size())], dtype=bool)
        self._any_digit_comma = bool(self._digit_comma.any())
        return self

    @staticmethod
    def version() -> str:
        import sentencepiece

        return sentencepiece.__version__

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        encoded = self._sp.encode(texts, num_threads=1)
        if self._any_digit_comma:
            encoded = [self._albert_pieces(ids) if self._digit_comma[ids].any() else ids for ids in encoded]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        ids = np.fromiter((i for row in encoded for i in row), dtype=np.int64, count=int(lengths.sum()))
        if self._id_map is not None:
            ids = self._id_map[ids]
        return ids.astype(np.int32), lengths

    def _albert_pieces(self, ids: list[int]) -> list[int]:
        """HF ``AlbertTokenizer._tokenize``: a piece ending in a digit and a comma is encoded again
        without the comma (its ``▁`` dropped where the piece had none), then the comma."""
        sp, out = self._sp, []
        for i in ids:
            piece = sp.id_to_piece(i)
            if not self._digit_comma[i]:
                out.append(i)
                continue
            pieces = sp.encode(piece[:-1].replace("▁", ""), out_type=str)
            if piece[0] != "▁" and pieces and pieces[0][0] == "▁":
                pieces = pieces[1:] if len(pieces[0]) == 1 else [pieces[0][1:], *pieces[1:]]
            out += [sp.piece_to_id(p) for p in [*pieces, piece[-1]]]
        return out

