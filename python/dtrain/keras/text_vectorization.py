"""tf.keras.layers.TextVectorization: strings to token ids (or to multi-hot, count and
tf-idf vectors), with a vocabulary that adapt() learns from the text.

It runs in Python on the strings' values, before the model: apply it to arrays, or map it
over a dataset of strings (``ds.map(lambda x, y: (vectorize(x), y))``), as TensorFlow's
guides do for training. A model takes the numbers it gives; placed inside a model it is
refused by name (dtrain's models run in C++ and take numbers).
"""
import collections
import math
import os
import re

import numpy as np

from .. import _dtrain
from .. import strings as strings_module

# Keras's punctuation: what "strip_punctuation" removes.
_PUNCTUATION = re.compile(rb'[!"#$%&()\*\+,\-\./:;<=>?@\[\\\]^_`{|}~\']')
_STANDARDIZE = ("lower_and_strip_punctuation", "lower", "strip_punctuation")
_SPLIT = ("whitespace", "character")
_MODES = ("int", "multi_hot", "count", "tf_idf")
MASK_TOKEN = ""
OOV_TOKEN = "[UNK]"


def _as_strings(value, where):
    """An object array of bytes from a string tensor, an array, a list or one str."""
    if isinstance(value, _dtrain.Tensor):
        if value.dtype != "string":
            raise TypeError(f"{where}: a {value.dtype} tensor where strings are expected (text, before vectorizing)")
        return np.asarray(value.numpy(), dtype=object)
    return np.asarray(strings_module._values(value, "TextVectorization"), dtype=object)


def padded(rows, length=None):
    """Rows of ids as int32 [rows, length]: cut to `length`, padded with 0 (to the longest
    row where length is None; dtrain has no ragged tensors)."""
    if length is None:
        length = max((len(r) for r in rows), default=0)
    out = np.zeros((len(rows), length), dtype=np.int32)
    for i, row in enumerate(rows):
        row = row[:length]
        out[i, :len(row)] = row
    return out


class TextVectorization:
    """Keras's TextVectorization: standardize, split, (ngrams), then look each token up in
    the vocabulary. Index 0 is the padding ("") and 1 the out-of-vocabulary token ("[UNK]")
    in "int" mode; the other modes have no padding, so "[UNK]" is 0. adapt() orders the
    vocabulary by count, ties by the token, descending (as Keras does), and keeps max_tokens
    entries with those. Ids are int32 (dtrain holds TensorFlow's int64 as int32)."""

    def __init__(self, max_tokens=None, standardize="lower_and_strip_punctuation", split="whitespace", ngrams=None,
                 output_mode="int", output_sequence_length=None, pad_to_max_tokens=False, vocabulary=None,
                 idf_weights=None, sparse=False, ragged=False, encoding="utf-8", name=None, **kwargs):
        kwargs.pop("trainable", None)
        kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(f"TextVectorization: unexpected argument(s) {sorted(kwargs)}")
        if not (standardize is None or callable(standardize) or standardize in _STANDARDIZE):
            raise ValueError(f"TextVectorization: standardize must be one of {_STANDARDIZE}, None or a callable, "
                             f"got {standardize!r}")
        if not (split is None or callable(split) or split in _SPLIT):
            raise ValueError(f"TextVectorization: split must be one of {_SPLIT}, None or a callable, got {split!r}")
        if output_mode not in _MODES:
            raise ValueError(f"TextVectorization: output_mode must be one of {_MODES}, got {output_mode!r}")
        if output_sequence_length is not None and output_mode != "int":
            raise ValueError("TextVectorization: output_sequence_length is for output_mode='int' only, "
                             f"not {output_mode!r}")
        if max_tokens is not None and max_tokens < 1 + (output_mode == "int"):
            raise ValueError(f"TextVectorization: max_tokens must leave room for the special tokens, got {max_tokens}")
        if pad_to_max_tokens and (max_tokens is None or output_mode == "int"):
            raise ValueError("TextVectorization: pad_to_max_tokens needs max_tokens and a vector output_mode")
        if sparse or ragged:
            raise NotImplementedError("TextVectorization(sparse=True or ragged=True) is not supported by dtrain: "
                                      "its outputs are dense (padded with 0)")
        if encoding.lower().replace("-", "") != "utf8":
            raise ValueError(f"TextVectorization: encoding must be 'utf-8', got {encoding!r}")
        if isinstance(ngrams, int):
            ngrams = tuple(range(1, ngrams + 1))
        self.max_tokens = max_tokens
        self.standardize = standardize
        self.split = split
        self.ngrams = None if ngrams is None else tuple(int(n) for n in ngrams)
        self.output_mode = output_mode
        self.output_sequence_length = output_sequence_length
        self.pad_to_max_tokens = bool(pad_to_max_tokens)
        self.name = name or "text_vectorization"
        # As given (a list or a file's path), for get_config.
        self._given_vocabulary = None if vocabulary is None else (
            vocabulary if isinstance(vocabulary, (str, os.PathLike)) else
            [t.decode() if isinstance(t, bytes) else str(t) for t in np.asarray(vocabulary, dtype=object).reshape(-1)])
        self._given_idf = None if idf_weights is None else np.asarray(idf_weights, dtype=np.float32).tolist()
        self._vocabulary = []  # the learned tokens (bytes), without the special ones
        self._index = {}
        self._idf = None
        if vocabulary is not None:
            self.set_vocabulary(vocabulary, idf_weights)

    # --- the vocabulary
    def _specials(self):
        return [MASK_TOKEN, OOV_TOKEN] if self.output_mode == "int" else [OOV_TOKEN]

    def _first_index(self):
        return len(self._specials())

    def get_vocabulary(self, include_special_tokens=True):
        tokens = [t.decode("utf-8", "replace") for t in self._vocabulary]
        return (self._specials() + tokens) if include_special_tokens else tokens

    def vocabulary_size(self):
        return self._first_index() + len(self._vocabulary)

    def set_vocabulary(self, vocabulary, idf_weights=None):
        """The vocabulary as a list of tokens or a file of one token a line; the special
        tokens, where it starts with them, are taken as such."""
        if isinstance(vocabulary, (str, os.PathLike)):
            with open(vocabulary, "rb") as f:
                tokens = [line.rstrip(b"\r\n") for line in f]
        else:
            tokens = [t.encode() if isinstance(t, str) else bytes(t) for t in np.asarray(vocabulary, dtype=object)
                      .reshape(-1).tolist()]
        specials = [s.encode() for s in self._specials()]
        if tokens[:len(specials)] == specials:
            tokens = tokens[len(specials):]
        seen = set()
        for t in tokens:
            if t in seen:
                raise ValueError(f"TextVectorization: the vocabulary holds {t.decode('utf-8', 'replace')!r} twice")
            if t in specials:
                raise ValueError(f"TextVectorization: the vocabulary holds the special token "
                                 f"{t.decode('utf-8', 'replace')!r} away from the start")
            seen.add(t)
        if self.max_tokens is not None and len(tokens) + len(specials) > self.max_tokens:
            raise ValueError(f"TextVectorization: a vocabulary of {len(tokens) + len(specials)} tokens (with the "
                             f"special ones) is more than max_tokens={self.max_tokens}")
        if self.output_mode == "tf_idf":
            if idf_weights is None:
                raise ValueError("TextVectorization: output_mode='tf_idf' needs idf_weights with the vocabulary")
            idf = np.asarray(idf_weights, dtype=np.float32).reshape(-1)
            if idf.size == len(tokens) + len(specials):
                idf = idf[len(specials):]
            if idf.size != len(tokens):
                raise ValueError(f"TextVectorization: {idf.size} idf_weights for {len(tokens)} tokens")
            self._idf = np.concatenate([[idf.mean() if idf.size else 0.0], idf]).astype(np.float32)
        elif idf_weights is not None:
            raise ValueError("TextVectorization: idf_weights are for output_mode='tf_idf' only")
        self._vocabulary = tokens
        self._index = {t: i + len(specials) for i, t in enumerate(tokens)}

    def adapt(self, data, batch_size=None, steps=None):
        """Learns the vocabulary (and the idf weights) from `data`: strings in an array, a
        list, a tensor, or a Dataset of them (batched or not; `steps` batches of it)."""
        del batch_size
        from ..data import Dataset

        counts = collections.Counter()
        documents = collections.Counter()
        n_documents = 0

        def take(values):
            nonlocal n_documents
            for tokens in self._tokens(_as_strings(values, "TextVectorization.adapt")):
                counts.update(tokens)
                if self.output_mode == "tf_idf":
                    documents.update(set(tokens))
                n_documents += 1

        if isinstance(data, Dataset):
            for i, element in enumerate(data):
                if steps is not None and i >= steps:
                    break
                if isinstance(element, (tuple, list, dict)):
                    raise ValueError("TextVectorization.adapt: the dataset's elements must be strings alone, not "
                                     "(text, label) pairs; map them to the text first")
                take(element)
        else:
            take(data)
        ordered = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
        if self.max_tokens is not None:
            ordered = ordered[:self.max_tokens - self._first_index()]
        self._vocabulary = [t for t, _ in ordered]
        self._index = {t: i + self._first_index() for i, t in enumerate(self._vocabulary)}
        if self.output_mode == "tf_idf":
            idf = np.array([math.log(1 + n_documents / (1 + documents[t])) for t in self._vocabulary], dtype=np.float32)
            self._idf = np.concatenate([[idf.mean() if idf.size else 0.0], idf]).astype(np.float32)

    # --- the steps of a call
    def _standardized(self, values):
        if self.standardize is None:
            return values
        if callable(self.standardize):
            return _as_strings(self.standardize(_dtrain.Tensor(values, "string")), "TextVectorization: standardize")
        out = np.empty(values.shape, dtype=object)
        lower = self.standardize in ("lower", "lower_and_strip_punctuation")
        strip = self.standardize in ("strip_punctuation", "lower_and_strip_punctuation")
        for i, v in enumerate(values.reshape(-1)):
            if lower:
                v = v.decode("utf-8", "replace").lower().encode()
            if strip:
                v = _PUNCTUATION.sub(b"", v)
            out.reshape(-1)[i] = v
        return out

    def _split(self, value):
        if self.split is None:
            return [value]
        if self.split == "whitespace":
            return value.split()
        if self.split == "character":
            return [c.encode() for c in value.decode("utf-8", "replace")]
        parts = self.split(_dtrain.Tensor(np.array([value], dtype=object), "string"))
        return [p for p in _as_strings(parts, "TextVectorization: split").reshape(-1).tolist()]

    def _with_ngrams(self, tokens):
        if self.ngrams is None:
            return tokens
        out = []
        for n in self.ngrams:
            out.extend(b" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
        return out

    def _tokens(self, values):
        """Each string's tokens (bytes): the rows of a [batch, 1] input are its strings."""
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.ndim > 1:
            raise ValueError(f"TextVectorization: takes strings shaped [batch] or [batch, 1], got {values.shape}")
        standardized = self._standardized(values)
        return [self._with_ngrams(self._split(v)) for v in standardized.reshape(-1)]

    def __call__(self, inputs):
        from .layers import KerasTensor

        if isinstance(inputs, KerasTensor):
            raise TypeError("TextVectorization cannot be a layer of a dtrain model (its models take numbers): "
                            "apply it to the text before the model, or map it over the dataset, "
                            "ds.map(lambda x, y: (vectorize(x), y))")
        values = _as_strings(inputs, self.name)
        scalar = values.ndim == 0
        rows = self._tokens(values.reshape(1) if scalar else values)
        oov = 1 if self.output_mode == "int" else 0
        ids = [[self._index.get(t, oov) for t in row] for row in rows]
        if self.output_mode == "int":
            out = padded(ids, self.output_sequence_length)
            return _dtrain.Tensor(out[0] if scalar else out, "int32")
        width = self.max_tokens if self.pad_to_max_tokens else self.vocabulary_size()
        out = np.zeros((len(ids), width), dtype=np.float32)
        for i, row in enumerate(ids):
            np.add.at(out[i], np.asarray(row, dtype=np.int64), 1.0)
        if self.output_mode == "multi_hot":
            out = np.minimum(out, 1.0)
        elif self.output_mode == "tf_idf":
            if self._idf is None:
                raise ValueError(f"{self.name}: output_mode='tf_idf' needs adapt() or idf_weights first")
            out[:, :self._idf.size] *= self._idf
        return _dtrain.Tensor(out[0] if scalar else out, "float32")

    # --- Keras's config
    def get_config(self):
        return {"name": self.name, "max_tokens": self.max_tokens,
                "standardize": self.standardize if not callable(self.standardize) else self.standardize.__name__,
                "split": self.split if not callable(self.split) else self.split.__name__,
                "ngrams": None if self.ngrams is None else list(self.ngrams), "output_mode": self.output_mode,
                "output_sequence_length": self.output_sequence_length, "pad_to_max_tokens": self.pad_to_max_tokens,
                "vocabulary": self._given_vocabulary, "idf_weights": self._given_idf,
                "vocabulary_size": self.vocabulary_size(),
                "sparse": False, "ragged": False, "encoding": "utf-8"}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config.pop("vocabulary_size", None)
        for key in ("standardize", "split"):
            if config.get(key) not in (None, *(_STANDARDIZE if key == "standardize" else _SPLIT)):
                raise ValueError(f"TextVectorization.from_config: a {key} function ({config[key]!r}) cannot be "
                                 "restored from its name; pass it to TextVectorization again")
        return cls(**config)
