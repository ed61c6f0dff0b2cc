"""tf.strings: element-wise operations on string tensors (UTF-8 text as bytes).

They run in Python on the strings' values, as the functions a TextVectorization's
`standardize` or a dataset's `map` calls; they have no gradient (strings have none).
"""
import re

import numpy as np

from . import _dtrain


def _values(value, fn):
    """A string tensor, array, list or str as an object array of bytes."""
    if isinstance(value, _dtrain.Tensor):
        if value.dtype != "string":
            raise TypeError(f"tf.strings.{fn}: a {value.dtype} tensor where strings are expected")
        return np.asarray(value.numpy(), dtype=object)  # a scalar's numpy() is its bytes
    array = np.array(value, dtype=object)  # a copy: the caller's array is not changed
    flat = array.reshape(-1)
    for i, item in enumerate(flat):
        if isinstance(item, str):
            flat[i] = item.encode()
        elif not isinstance(item, bytes):
            raise TypeError(f"tf.strings.{fn}: element {i} is a {type(item).__name__}, not a string")
    return flat.reshape(array.shape)


def _tensor(array):
    return _dtrain.Tensor(np.asarray(array, dtype=object), "string")


def _each(value, fn, op):
    values = _values(value, fn)
    out = np.empty(values.shape, dtype=object)
    flat_in, flat_out = values.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        flat_out[i] = op(v)
    return out


def lower(input, encoding="", name=None):  # noqa: A002 (TensorFlow's argument name)
    """Lower case; with encoding="utf-8" every letter Unicode has a lower case of, else ASCII's."""
    del name
    if encoding.lower().replace("-", "") == "utf8":
        return _tensor(_each(input, "lower", lambda v: v.decode("utf-8", "replace").lower().encode()))
    return _tensor(_each(input, "lower", bytes.lower))


def upper(input, encoding="", name=None):  # noqa: A002
    del name
    if encoding.lower().replace("-", "") == "utf8":
        return _tensor(_each(input, "upper", lambda v: v.decode("utf-8", "replace").upper().encode()))
    return _tensor(_each(input, "upper", bytes.upper))


def strip(input, name=None):  # noqa: A002
    """Leading and trailing whitespace removed."""
    del name
    return _tensor(_each(input, "strip", bytes.strip))


def regex_replace(input, pattern, rewrite, replace_global=True, name=None):  # noqa: A002
    """Matches of `pattern` replaced by `rewrite` (\\\\1 for a group, as RE2 writes it)."""
    del name
    compiled = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
    rewrite = rewrite.encode() if isinstance(rewrite, str) else rewrite
    return _tensor(_each(input, "regex_replace", lambda v: compiled.sub(rewrite, v, count=0 if replace_global else 1)))


def length(input, unit="BYTE", name=None):  # noqa: A002
    """Each string's length in bytes, or with unit="UTF8_CHAR" in characters (int32)."""
    del name
    if unit not in ("BYTE", "UTF8_CHAR"):
        raise ValueError(f"tf.strings.length: unit must be 'BYTE' or 'UTF8_CHAR', got {unit!r}")
    count = len if unit == "BYTE" else (lambda v: len(v.decode("utf-8", "replace")))
    return _dtrain.Tensor(_each(input, "length", count).astype(np.int32), "int32")


def join(inputs, separator="", name=None):
    """Element-wise concatenation of the tensors in `inputs` (of one shape), with `separator`."""
    del name
    parts = [_values(x, "join") for x in inputs]
    if not parts:
        raise ValueError("tf.strings.join: no inputs")
    if any(p.shape != parts[0].shape for p in parts):
        raise ValueError(f"tf.strings.join: the inputs' shapes differ: {[p.shape for p in parts]}")
    sep = separator.encode() if isinstance(separator, str) else separator
    out = np.empty(parts[0].shape, dtype=object)
    flat = [p.reshape(-1) for p in parts]
    for i in range(out.size):
        out.reshape(-1)[i] = sep.join(p[i] for p in flat)
    return _tensor(out)


def to_number(string_tensor, out_type=None, name=None):
    """Each string read as a number (float32 by default; int32 or int64 read whole numbers,
    held as int32). A string that is not one is an InvalidArgumentError naming it."""
    del name
    type_name = "float32" if out_type is None else getattr(out_type, "name", str(out_type))
    values = _values(string_tensor, "to_number")
    whole = type_name in ("int32", "int64")

    def number(v):
        try:
            return int(v) if whole else float(v)
        except ValueError:
            raise _dtrain.errors.InvalidArgumentError(
                f"tf.strings.to_number: {v!r} is not {'a whole number' if whole else 'a number'}") from None

    array = _each(string_tensor, "to_number", number) if values.size else values
    return _dtrain.Tensor(np.asarray(array, dtype=np.int32 if whole else np.float32), "int32" if whole else "float32")
