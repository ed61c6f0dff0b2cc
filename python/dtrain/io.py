"""tf.io: TFRecord files (TFRecordWriter, TFRecordOptions), tf.train.Example's parsing
(FixedLenFeature, VarLenFeature, FixedLenSequenceFeature, parse_single_example,
parse_example) and tensors as bytes (serialize_tensor, parse_tensor, decode_raw).

Integers an Example holds (int64) are int32 tensors here, as dtrain holds int64; a value
beyond int32 is an error naming the feature. Parsing runs in C++ without the GIL; parse a
batch at once (ds.batch(n).map(lambda b: tf.io.parse_example(b, spec))) for speed, as
TensorFlow's guide advises."""
import collections
import glob as _glob
import os

import numpy as np

from . import _dtrain
from ._core import _dtype_name, _raw_dtype_name, convert_to_tensor

_data = _dtrain.data

_COMPRESSIONS = {None: "", "": "", "NONE": "", "ZLIB": "ZLIB", "GZIP": "GZIP"}


def _compression(fn, value):
    if isinstance(value, TFRecordOptions):
        return value.compression_type, value.compression_level
    key = value.upper() if isinstance(value, str) else value
    if key not in _COMPRESSIONS:
        raise ValueError(f"{fn}: compression_type {value!r} is not one TensorFlow names (None, '', 'ZLIB' or 'GZIP')")
    return _COMPRESSIONS[key], -1


class TFRecordOptions:
    """tf.io.TFRecordOptions: compression_type (None, '', 'ZLIB' or 'GZIP') and
    compression_level (0-9; None: zlib's default). zlib's buffer and window arguments are
    accepted and left to zlib."""

    def __init__(self, compression_type=None, flush_mode=None, input_buffer_size=None, output_buffer_size=None,
                 window_bits=None, compression_level=None, compression_method=None, mem_level=None,
                 compression_strategy=None):
        del flush_mode, input_buffer_size, output_buffer_size, window_bits, compression_method, mem_level
        del compression_strategy
        self.compression_type = _compression("TFRecordOptions", compression_type)[0]
        self.compression_level = -1 if compression_level is None else int(compression_level)
        if not -1 <= self.compression_level <= 9:
            raise ValueError(f"TFRecordOptions: compression_level {compression_level} is not in 0-9")

    @classmethod
    def get_compression_type_string(cls, options):
        if options is None:
            return ""
        return options.compression_type if isinstance(options, TFRecordOptions) else _compression("TFRecordOptions", options)[0]


class TFRecordWriter:
    """tf.io.TFRecordWriter(path, options=None): writes records (bytes, or str as UTF-8) to a
    new file, each framed as TensorFlow frames it ([u64 length][masked CRC-32C of it][bytes]
    [masked CRC-32C of them]), compressed as options say ('ZLIB', 'GZIP' or a
    TFRecordOptions). A context manager; close() ends the file, and errors name it."""

    def __init__(self, path, options=None):
        compression, level = _compression("TFRecordWriter", options)
        self._writer = _data._TFRecordWriter(os.fspath(path), compression, level)

    def write(self, record):
        if isinstance(record, str):
            record = record.encode()
        elif isinstance(record, _dtrain.Tensor):
            record = record.numpy()
        self._writer.write(bytes(record))

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- tf.train.Example against a spec

_KINDS = {"float32": "float32", "int64": "int32", "int32": "int32", "string": "string"}


def _feature_dtype(fn, key, dtype):
    name = _raw_dtype_name(dtype)
    if name not in _KINDS:
        raise ValueError(f"{fn}: feature {key!r}: dtype {name} is not one an Example holds (float32, int64 or string)")
    return _KINDS[name]


def _shape(shape):
    if shape is None:
        return []
    if isinstance(shape, int):
        return [shape]
    return [int(d) for d in shape]


FixedLenFeature = collections.namedtuple("FixedLenFeature", ["shape", "dtype", "default_value"],
                                         defaults=[None])
FixedLenFeature.__doc__ = ("tf.io.FixedLenFeature(shape, dtype, default_value=None): a value of `shape` in each "
                           "Example; missing, it is default_value (or an error naming it).")
VarLenFeature = collections.namedtuple("VarLenFeature", ["dtype"])
VarLenFeature.__doc__ = "tf.io.VarLenFeature(dtype): any number of values, as a SparseTensor."
FixedLenSequenceFeature = collections.namedtuple("FixedLenSequenceFeature",
                                                 ["shape", "dtype", "allow_missing", "default_value"],
                                                 defaults=[False, None])
FixedLenSequenceFeature.__doc__ = ("tf.io.FixedLenSequenceFeature(shape, dtype, allow_missing=False, "
                                   "default_value=None): items of `shape`, as many as the Example holds; a batch is "
                                   "padded to its longest with default_value (or zeros).")


def _specs(fn, features):
    if not isinstance(features, dict):
        raise TypeError(f"{fn}: features must be a dict of feature names to FixedLenFeature, VarLenFeature or "
                        f"FixedLenSequenceFeature, got {type(features).__name__}")
    specs = []
    for key in sorted(features):
        f = features[key]
        if isinstance(f, FixedLenFeature):
            kind, allow = 0, False
        elif isinstance(f, VarLenFeature):
            kind, allow = 1, False
        elif isinstance(f, FixedLenSequenceFeature):
            kind, allow = 2, bool(f.allow_missing)
        else:
            raise TypeError(f"{fn}: feature {key!r} is a {type(f).__name__}, not a FixedLenFeature, VarLenFeature "
                            "or FixedLenSequenceFeature")
        dtype = _feature_dtype(fn, key, f.dtype)
        shape = [] if kind == 1 else _shape(f.shape)
        default = getattr(f, "default_value", None)
        if default is not None:
            default = np.asarray(default.numpy() if isinstance(default, _dtrain.Tensor) else default,
                                 dtype=object if dtype == "string" else None)
        specs.append((key, kind, dtype, shape, default, allow))
    return specs


def _serialized(value):
    if isinstance(value, (bytes, str)):
        return np.asarray(value.encode() if isinstance(value, str) else value, dtype=object)
    if isinstance(value, (list, tuple)):
        return np.asarray([v.encode() if isinstance(v, str) else v for v in value], dtype=object)
    return value


def _parsed(fn, serialized, features):
    specs = _specs(fn, features)
    out = {}
    for (key, kind, *_), (values, indices, dense_shape) in zip(specs, _data.parse_examples(_serialized(serialized), specs)):
        out[key] = SparseTensor(indices, values, dense_shape) if kind == 1 else values
    return out


def parse_single_example(serialized, features, example_names=None, name=None):
    """One serialized tf.train.Example (a string scalar) -> {key: tensor}: FixedLenFeature
    gives its shape, FixedLenSequenceFeature [n, *shape], VarLenFeature a SparseTensor."""
    del example_names, name
    return _parsed("parse_single_example", serialized, features)


def parse_example(serialized, features, example_names=None, name=None):
    """A batch of serialized tf.train.Examples (a string vector) -> {key: tensor}, each with
    the batch axis first; sequences padded to the longest, VarLenFeature a SparseTensor of
    rank 2."""
    del example_names, name
    return _parsed("parse_example", serialized, features)


class SparseTensor:
    """tf.sparse.SparseTensor: indices (int32 [n, rank]), values [n] and dense_shape."""

    def __init__(self, indices, values, dense_shape):
        self.indices = convert_to_tensor(indices)
        self.values = values if isinstance(values, _dtrain.Tensor) else convert_to_tensor(values)
        self.dense_shape = convert_to_tensor(dense_shape)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def shape(self):
        return tuple(int(d) for d in np.asarray(self.dense_shape.numpy()).reshape(-1))

    def __repr__(self):
        return f"SparseTensor(indices={self.indices!r}, values={self.values!r}, dense_shape={self.dense_shape!r})"


def sparse_to_dense(sp, default_value=None, validate_indices=True, name=None):
    """tf.sparse.to_dense: the dense tensor of `dense_shape`, values at their indices and
    default_value (0, or b'') elsewhere."""
    del validate_indices, name
    values = np.asarray(sp.values.numpy())
    shape = sp.shape
    if values.dtype == object:
        out = np.full(shape, b"" if default_value is None else default_value, dtype=object)
    else:
        out = np.full(shape, 0 if default_value is None else default_value, dtype=values.dtype)
    indices = np.asarray(sp.indices.numpy()).reshape(len(values), len(shape)) if len(shape) else np.zeros((0, 0), int)
    for i, index in enumerate(indices):
        out[tuple(index)] = values[i]
    return convert_to_tensor(out)


# ---- tensors as bytes

_RAW = {"uint8", "int32", "float32", "bfloat16"}
_NUMPY_RAW = {"float64": np.float64, "float16": np.float16, "int64": np.int64, "int16": np.int16, "int8": np.int8,
              "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_}


def _strings(value):
    if isinstance(value, _dtrain.Tensor):
        return np.asarray(value.numpy(), dtype=object)
    return np.asarray(_serialized(value), dtype=object)


def decode_raw(input_bytes, out_type, little_endian=True, fixed_length=None, name=None):
    """tf.io.decode_raw: each string as an array of out_type, giving input.shape + [n].
    uint8, int32, float32 and bfloat16 stay as they are; other types are read as numpy
    reads them and held as dtrain holds them (float64 and float16 as float32, int64 and
    the small integers as int32)."""
    del name
    type_name = _raw_dtype_name(out_type)
    if type_name in _RAW and fixed_length is None and isinstance(input_bytes, _dtrain.Tensor):
        return _data.decode_raw(input_bytes, type_name, bool(little_endian))  # no copy through Python
    strings = _strings(input_bytes)
    if fixed_length is not None:
        n = int(fixed_length)
        flat = [bytes(s)[:n].ljust(n, b"\0") for s in strings.reshape(-1)]
        strings = np.asarray(flat, dtype=object).reshape(strings.shape)
    if type_name in _RAW:
        return _data.decode_raw(strings, type_name, bool(little_endian))
    if type_name not in _NUMPY_RAW:
        raise ValueError(f"decode_raw: out_type {type_name} is not a number type")
    dtype = np.dtype(_NUMPY_RAW[type_name]).newbyteorder("<" if little_endian else ">")
    flat = strings.reshape(-1)
    lengths = {len(bytes(s)) for s in flat}
    if len(lengths) > 1:
        raise _dtrain.errors.InvalidArgumentError("decode_raw: every string must have the same length, got "
                                                  f"lengths {sorted(lengths)}")
    arrays = [np.frombuffer(bytes(s), dtype=dtype) for s in flat]
    width = arrays[0].size if arrays else 0
    out = np.stack(arrays).reshape(strings.shape + (width,)) if arrays else np.zeros(strings.shape + (0,), dtype)
    return convert_to_tensor(out.astype(dtype.newbyteorder("=")))


def serialize_tensor(tensor, name=None):
    """tf.io.serialize_tensor: a string scalar holding the tensor's TensorProto (dtype,
    shape, tensor_content or string_val), as TensorFlow writes it."""
    del name
    return convert_to_tensor(np.asarray(_data.serialize_tensor(convert_to_tensor(tensor)), dtype=object))


def parse_tensor(serialized, out_type, name=None):
    """tf.io.parse_tensor: the tensor a serialized TensorProto holds; out_type must be its
    dtype (int64 reads as int32)."""
    del name
    data = serialized
    if isinstance(serialized, _dtrain.Tensor):
        data = serialized.numpy()
    if isinstance(data, np.ndarray):
        data = data.item()
    return _data.parse_tensor(bytes(data), _dtype_name(out_type))


class gfile:  # noqa: N801 (TensorFlow's module name)
    """tf.io.gfile, for local files: glob (sorted), exists, makedirs, listdir, remove."""

    @staticmethod
    def glob(pattern):
        patterns = [pattern] if isinstance(pattern, (str, bytes, os.PathLike)) else list(pattern)
        found = set()
        for p in patterns:
            found.update(_glob.glob(os.fsdecode(p)))
        return sorted(found)

    exists = staticmethod(os.path.exists)
    listdir = staticmethod(os.listdir)
    remove = staticmethod(os.remove)
    isdir = staticmethod(os.path.isdir)

    @staticmethod
    def makedirs(path):
        os.makedirs(path, exist_ok=True)

