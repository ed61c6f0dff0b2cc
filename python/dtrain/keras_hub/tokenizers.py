"""keras_hub.tokenizers: SentencePiece, through Debian's libsentencepiece.

compute_sentence_piece_proto trains a model on text (an array or list of strings, a
Dataset of them, or text files) with dtrain's pipeline feeding the trainer; a
SentencePieceTokenizer takes that model (its bytes or a .model file, also one trained
elsewhere) and turns strings into int32 ids and back. They run before the model: apply them
to arrays or map them over a dataset of strings.
"""
import os

import numpy as np

from .. import _dtrain
from .. import strings as strings_module
from ..data import Dataset, TextLineDataset
from ..keras.text_vectorization import padded

_SentencePiece = _dtrain.data._SentencePiece


def _sentences(data):
    """The C++ dataset of strings that `data` is."""
    if isinstance(data, Dataset):
        return data._cpp
    if isinstance(data, (str, os.PathLike)) and os.path.exists(data):
        return TextLineDataset(data)._cpp
    values = strings_module._values(data, "compute_sentence_piece_proto")
    return Dataset.from_tensor_slices(_dtrain.Tensor(values.reshape(-1), "string"))._cpp


def compute_sentence_piece_proto(data, vocabulary_size, model_type="unigram", proto_output_file=None,
                                 lowercase=False, character_coverage=0.9995, max_sentences=1000000, **flags):
    """Trains a SentencePiece model on `data` and returns its bytes (or writes them to
    proto_output_file). `data`: strings (array, list, tensor), a Dataset of string elements
    (TextLineDataset, say), or a text file's path. Other SentencePiece trainer flags may be
    given by name (user_defined_symbols="<sep>", pad_id=0, ...)."""
    if model_type not in ("unigram", "bpe", "char", "word"):
        raise ValueError(f"compute_sentence_piece_proto: model_type must be 'unigram', 'bpe', 'char' or 'word', "
                         f"got {model_type!r}")
    extra = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in flags.items()}
    sp = _SentencePiece.train(_sentences(data), int(vocabulary_size), model_type, float(character_coverage),
                              int(max_sentences), bool(lowercase), extra)
    proto = sp.serialized()
    if proto_output_file is not None:
        with open(proto_output_file, "wb") as f:
            f.write(proto)
        return None
    return proto


class SentencePieceTokenizer:
    """keras_hub's SentencePieceTokenizer. proto: the model's bytes or a .model file's path.
    tokenize (or calling it) gives int32 ids: a string gives a vector; a batch [n] gives
    [n, length], padded with 0 to sequence_length (or to its longest, where no
    sequence_length is set: dtrain has no ragged tensors) and cut to it. detokenize turns ids
    back into strings."""

    def __init__(self, proto=None, sequence_length=None, dtype="int32", add_bos=False, add_eos=False, name=None,
                 **kwargs):
        del kwargs
        if dtype not in ("int32", "int64", "string"):
            raise ValueError(f"SentencePieceTokenizer: dtype must be 'int32' or 'string', got {dtype!r}")
        self.sequence_length = sequence_length
        self.dtype = dtype
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.name = name or "sentence_piece_tokenizer"
        self._sp = None
        self.proto = None
        if proto is not None:
            self.set_proto(proto)

    def set_proto(self, proto):
        if isinstance(proto, (str, os.PathLike)):
            self._sp = _SentencePiece.load(os.fspath(proto))
        else:
            self._sp = _SentencePiece.from_bytes(bytes(proto))
        self.proto = self._sp.serialized()
        if self.add_bos and self._sp.bos_id() < 0:
            raise ValueError("SentencePieceTokenizer: add_bos, but the model has no <s> piece")
        if self.add_eos and self._sp.eos_id() < 0:
            raise ValueError("SentencePieceTokenizer: add_eos, but the model has no </s> piece")

    def _model(self):
        if self._sp is None:
            raise ValueError(f"{self.name}: no proto yet; pass one (compute_sentence_piece_proto makes one)")
        return self._sp

    def vocabulary_size(self):
        return self._model().vocab_size()

    def get_vocabulary(self):
        sp = self._model()
        return [sp.id_to_piece(i) for i in range(sp.vocab_size())]

    def id_to_token(self, id):  # noqa: A002 (keras_hub's argument name)
        return self._model().id_to_piece(int(id))

    def token_to_id(self, token):
        return self._model().piece_to_id(token)

    def tokenize(self, inputs):
        sp = self._model()
        values = strings_module._values(inputs, "SentencePieceTokenizer.tokenize")
        scalar = values.ndim == 0
        flat = values.reshape(-1).tolist()
        if self.dtype == "string":
            pieces = [sp.encode_pieces(v) for v in flat]
            return pieces[0] if scalar else pieces
        rows = sp.encode(flat)
        if self.add_bos:
            rows = [[sp.bos_id()] + r for r in rows]
        if self.add_eos:
            rows = [r + [sp.eos_id()] for r in rows]
        if scalar and self.sequence_length is None:
            return _dtrain.Tensor(np.asarray(rows[0], dtype=np.int32), "int32")
        out = padded(rows, self.sequence_length)
        return _dtrain.Tensor(out[0] if scalar else out, "int32")

    __call__ = tokenize

    def detokenize(self, inputs):
        sp = self._model()
        ids = np.asarray(inputs.numpy() if isinstance(inputs, _dtrain.Tensor) else inputs)
        if ids.ndim == 1:
            return _dtrain.Tensor(np.array(sp.decode([int(i) for i in ids]), dtype=object), "string")
        out = np.array([sp.decode([int(i) for i in row]) for row in ids.reshape(-1, ids.shape[-1])], dtype=object)
        return _dtrain.Tensor(out.reshape(ids.shape[:-1]), "string")

    def get_config(self):
        return {"name": self.name, "sequence_length": self.sequence_length, "dtype": self.dtype,
                "add_bos": self.add_bos, "add_eos": self.add_eos}
