"""tf.data: Dataset pipelines run by dtrain's C++ threads.

Elements are tensors, or tuples and dicts of them, nested as TensorFlow's are; the C++
pipeline holds their components in order (a dict's by sorted key). Python functions given
to from_generator, map and filter run on the pipeline's threads, one call at a time per
function, holding the GIL.
"""
import os

import numpy as np

from . import _dtrain
from ._core import TensorSpec, _dtype_name, _raw_dtype_name, _whole
from .io import SparseTensor

_data = _dtrain.data
AUTOTUNE = _data.AUTOTUNE
INFINITE_CARDINALITY = _data.INFINITE_CARDINALITY
UNKNOWN_CARDINALITY = _data.UNKNOWN_CARDINALITY


def _shapes_checked(elements, shapes, is_tuple):
    """The generator's elements, each checked against the signature's shapes (None: any
    size), as TensorFlow checks them: a wrong one is named, not trained on."""
    for index, element in enumerate(elements):
        parts = list(element) if is_tuple and isinstance(element, (tuple, list)) else [element]
        if len(parts) != len(shapes):
            raise _dtrain.errors.InvalidArgumentError(
                f"Dataset.from_generator: element {index} has {len(parts)} component(s) where the signature "
                f"gives {len(shapes)}")
        for component, (part, want) in enumerate(zip(parts, shapes)):
            if want is None:
                continue
            got = np.shape(part)
            if len(got) != len(want) or any(w is not None and w != g for g, w in zip(got, want)):
                where = f"element {index}" + (f", component {component}," if is_tuple else "")
                raise _dtrain.errors.InvalidArgumentError(
                    f"Dataset.from_generator: {where} has shape {tuple(got)}, not the signature's "
                    f"{tuple(want)} (None: any size)")
        yield element


class experimental:  # noqa: N801 (TensorFlow's module name)
    AUTOTUNE = _data.AUTOTUNE
    AutoShardPolicy = _data.AutoShardPolicy
    INFINITE_CARDINALITY = _data.INFINITE_CARDINALITY
    UNKNOWN_CARDINALITY = _data.UNKNOWN_CARDINALITY

    @staticmethod
    def prefetch_to_device(device, buffer_size=None):
        """tf.data.experimental.prefetch_to_device, for Dataset.apply: copies each element to
        the device ('/gpu:0') on a background thread, beside the GPU's compute stream, and
        keeps buffer_size of them there (None: AUTOTUNE). The pipeline's last stage."""
        size = _data.AUTOTUNE if buffer_size is None else _whole("prefetch_to_device", "buffer_size", buffer_size)

        def apply(dataset):
            return dataset._derive(dataset._cpp.prefetch_to_device(str(device), size))

        return apply


class _DistributeOptions:
    def __init__(self):
        self.auto_shard_policy = _data.AutoShardPolicy.AUTO


class Options:
    """tf.data.Options: of its fields, experimental_distribute.auto_shard_policy applies."""

    def __init__(self):
        self.experimental_distribute = _DistributeOptions()


_ONE = "."  # the structure of one tensor
_SPARSE = "sparse"  # a SparseTensor's: indices, values and dense_shape


def _flatten(value):
    """An element's components, depth first (a dict's in the order of its sorted keys, as
    tf.nest flattens it), and its structure: _ONE, a tuple of structures (a tuple or list)
    or a dict of them."""
    if isinstance(value, (tuple, list)):
        parts, structure = [], []
        for item in value:
            flat, inner = _flatten(item)
            parts += flat
            structure.append(inner)
        return parts, tuple(structure)
    if isinstance(value, SparseTensor):
        return [value.indices, value.values, value.dense_shape], _SPARSE
    if isinstance(value, dict):
        parts, structure = [], {}
        for key in sorted(value):
            flat, inner = _flatten(value[key])
            parts += flat
            structure[key] = inner
        return parts, structure
    return [value], _ONE


def _count(structure):
    if structure == _ONE:
        return 1
    if structure == _SPARSE:
        return 3
    values = structure.values() if isinstance(structure, dict) else structure
    return sum(_count(s) for s in values)


def _unflatten(parts, structure):
    """The element of `structure` whose components are `parts` (as _flatten gives them)."""
    if len(parts) != _count(structure):
        raise _dtrain.errors.InvalidArgumentError(
            f"Dataset: an element of {len(parts)} component(s) where its structure has {_count(structure)}")
    it = iter(parts)

    def build(s):
        if s == _ONE:
            return next(it)
        if s == _SPARSE:
            return SparseTensor(next(it), next(it), next(it))
        if isinstance(s, dict):
            return {key: build(inner) for key, inner in s.items()}
        return tuple(build(inner) for inner in s)

    return build(structure)


def _args(element):
    """A function's arguments for an element, as tf.data calls map and filter functions: a
    tuple's items, or the element alone."""
    return element if isinstance(element, tuple) else (element,)


class _Structure:
    """The structure of what a map function returns: known once it has been called (or,
    for interleave, once the dataset it made knows its own)."""

    def __init__(self):
        self._value = None
        self.source = None  # another _Structure this one is, where it is not known yet

    @property
    def value(self):
        if self._value is None and self.source is not None:
            return self.source.value
        return self._value

    @value.setter
    def value(self, structure):
        self._value = structure


class Dataset:
    """tf.data.Dataset over dtrain's pipeline. Iterating gives tensors, or tuples and dicts
    of them (nested as the source gave them); the pipeline holds their components."""

    def __init__(self, cpp, structure):
        self._cpp = cpp
        # What _flatten gives (_ONE, tuples and dicts of it), or a _Structure a map function
        # fills in; unknown (None) elements are a tuple of their components when they have
        # several.
        self._structure = structure

    def _derive(self, cpp, structure=...):
        return Dataset(cpp, self._structure if structure is ... else structure)

    def _element_structure(self, resolve=False):
        """The elements' structure; with resolve, a map function's is found by making the
        first element when no element was made yet."""
        s = self._structure
        if isinstance(s, _Structure):
            if s.value is None and resolve:
                try:
                    self._cpp.make_iterator(0).next()
                except StopIteration:
                    pass
            return s.value
        return s

    # --- sources
    @staticmethod
    def from_tensor_slices(tensors, name=None):
        del name
        parts, structure = _flatten(tensors)
        return Dataset(_data._Dataset.from_tensor_slices(parts), structure)

    @staticmethod
    def from_tensors(tensors, name=None):
        raise NotImplementedError("Dataset.from_tensors is not supported by dtrain; use from_tensor_slices")

    @staticmethod
    def from_generator(generator, output_types=None, output_shapes=None, args=None, output_signature=None, name=None):
        del name
        shapes = None
        if output_signature is not None:
            specs, structure = _flatten(output_signature)
            dtypes = [_dtype_name(s.dtype if isinstance(s, TensorSpec) else s) for s in specs]
            shapes = [s.shape if isinstance(s, TensorSpec) else None for s in specs]
        elif output_types is not None:
            types, structure = _flatten(output_types)
            dtypes = [_dtype_name(t) for t in types]
            if output_shapes is not None:
                shapes = list(output_shapes) if isinstance(structure, tuple) else [output_shapes]
                if len(shapes) != len(dtypes):
                    raise ValueError(f"Dataset.from_generator: output_shapes has {len(shapes)} component(s), "
                                     f"output_types {len(dtypes)}")
                shapes = [None if s is None else tuple(s) for s in shapes]
        else:
            raise TypeError("Dataset.from_generator needs output_signature (or output_types)")
        make = generator if not args else (lambda: generator(*args))
        if not isinstance(structure, tuple) or any(s != _ONE for s in structure):
            # Nested elements reach the pipeline as their components.
            nested = make
            make = lambda: (_flatten(e)[0] for e in nested())  # noqa: E731
        if shapes is not None and any(s is not None for s in shapes):
            unchecked = make
            make = lambda: _shapes_checked(unchecked(), shapes, structure != _ONE)  # noqa: E731
        return Dataset(_data._Dataset.from_generator(make, dtypes), structure)

    @staticmethod
    def range(*args, output_type=None, name=None):
        """Dataset.range(stop), (start, stop) or (start, stop, step), as Python's range: whole
        numbers (2.5 is a TypeError, as TensorFlow refuses it). Elements are int32, which
        holds TensorFlow's int64 here as labels are held."""
        del name
        named = "" if output_type is None else _raw_dtype_name(output_type)
        if named not in ("", "int32", "int64"):
            raise NotImplementedError(f"Dataset.range(output_type={output_type!r}) is not supported by dtrain: "
                                      "its elements are integers (int32); map a cast for others")
        if not 1 <= len(args) <= 3:
            raise TypeError(f"Dataset.range takes 1 to 3 arguments (start, stop, step), got {len(args)}")
        start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        return Dataset(_data._Dataset.range(*(_whole("Dataset.range", what, value) for what, value in
                                              (("start", start), ("stop", stop), ("step", step)))), _ONE)

    @staticmethod
    def list_files(file_pattern, shuffle=None, seed=None, name=None):
        """Dataset.list_files: the names of the files the pattern (or patterns) match, as
        string scalars, sorted and then shuffled each pass unless shuffle=False (seed fixes
        the order). A pattern that matches nothing is an error naming it. Under a
        multi-worker strategy it is a file source: AutoShardPolicy.FILE gives each worker
        its names, and the readers interleave makes of them read their whole files."""
        del name
        patterns = file_pattern if isinstance(file_pattern, (list, tuple)) else [file_pattern]
        names = _data._Dataset.glob([os.fsdecode(p.numpy() if isinstance(p, _dtrain.Tensor) else p) for p in patterns])
        dataset = Dataset(_data._Dataset.file_names(names), _ONE)
        if shuffle is None or shuffle:
            dataset = dataset.shuffle(len(names), seed=seed)
        return dataset

    # --- transformations
    def interleave(self, map_func, cycle_length=None, block_length=None, num_parallel_calls=None, deterministic=None,
                   name=None):
        """map_func makes a Dataset of each element; cycle_length of them are read in turn,
        block_length elements at a time, in TensorFlow's order (cycle_length None or
        AUTOTUNE: the machine's cores). num_parallel_calls reads the open datasets ahead on
        threads of their own; the order stays the same (deterministic or not)."""
        del deterministic, name
        cycle = AUTOTUNE if cycle_length is None else _whole("interleave", "cycle_length", cycle_length)
        block = 1 if block_length is None else _whole("interleave", "block_length", block_length)
        parallel = 0 if num_parallel_calls is None else int(num_parallel_calls)
        made = _Structure()

        def call(*parts):
            inner = map_func(*_args(self._element(parts)))
            if not isinstance(inner, Dataset):
                raise TypeError(f"interleave: map_func must return a tf.data.Dataset, got {type(inner).__name__}")
            if isinstance(inner._structure, _Structure):
                made.source = inner._structure
            else:
                made.value = inner._structure
            return inner._cpp

        return self._derive(self._cpp.interleave(call, cycle, block, parallel), made)

    def map(self, map_func, num_parallel_calls=None, deterministic=None, name=None):
        """map_func gets an element's parts as TensorFlow passes them (a tuple's items, or
        the element), and may return tensors, or tuples and dicts of them."""
        del name
        parallel = 0 if num_parallel_calls is None else int(num_parallel_calls)
        made = _Structure()

        def call(*parts):
            parts, structure = _flatten(map_func(*_args(self._element(parts))))
            made.value = structure
            return parts

        return self._derive(self._cpp.map(call, parallel, True if deterministic is None else bool(deterministic)), made)

    def filter(self, predicate, name=None):
        del name
        return self._derive(self._cpp.filter(lambda *parts: predicate(*_args(self._element(parts)))))

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True, name=None):
        del name
        size = _whole("shuffle", "buffer_size", buffer_size)
        return self._derive(self._cpp.shuffle(size, seed, bool(reshuffle_each_iteration)))

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        del num_parallel_calls, deterministic, name
        return self._derive(self._cpp.batch(_whole("batch", "batch_size", batch_size), bool(drop_remainder)))

    def unbatch(self, name=None):
        del name
        return self._derive(self._cpp.unbatch())

    def repeat(self, count=None, name=None):
        del name
        return self._derive(self._cpp.repeat(-1 if count is None else _whole("repeat", "count", count)))

    def take(self, count, name=None):
        del name
        return self._derive(self._cpp.take(_whole("take", "count", count)))

    def skip(self, count, name=None):
        del name
        return self._derive(self._cpp.skip(_whole("skip", "count", count)))

    def shard(self, num_shards, index, name=None):
        del name
        return self._derive(self._cpp.shard(_whole("shard", "num_shards", num_shards), _whole("shard", "index", index)))

    def cache(self, filename="", name=None):
        del name
        if filename:
            raise NotImplementedError("Dataset.cache(filename) is not supported by dtrain; cache() keeps it in memory")
        return self._derive(self._cpp.cache())

    def prefetch(self, buffer_size, name=None):
        del name
        return self._derive(self._cpp.prefetch(_whole("prefetch", "buffer_size", buffer_size)))

    def apply(self, transformation_func):
        """The dataset transformation_func makes of this one (tf.data's Dataset.apply)."""
        result = transformation_func(self)
        if not isinstance(result, Dataset):
            raise TypeError(f"Dataset.apply: the transformation returned a {type(result).__name__}, not a Dataset")
        return result

    def with_options(self, options, name=None):
        del name
        if not isinstance(options, Options):
            raise TypeError(f"Dataset.with_options takes a tf.data.Options, got {type(options).__name__}")
        return self._derive(self._cpp.with_shard_policy(options.experimental_distribute.auto_shard_policy))

    # --- inspection and iteration
    def cardinality(self):
        """A scalar int32 tensor: the count, INFINITE_CARDINALITY or UNKNOWN_CARDINALITY."""
        return _dtrain.convert_to_tensor(np.int32(self._cpp.cardinality()))

    def __len__(self):
        n = self._cpp.cardinality()
        if n < 0:
            raise TypeError("The dataset's length is " + ("infinite" if n == INFINITE_CARDINALITY else "unknown"))
        return n

    def _element(self, parts):
        structure = self._element_structure()
        if structure is None:
            return tuple(parts) if len(parts) > 1 else parts[0]
        return _unflatten(list(parts), structure)

    def __iter__(self):
        return DatasetIterator(self)

    def as_numpy_iterator(self):
        for element in self:
            parts, structure = _flatten(element)
            yield _unflatten([t.numpy() for t in parts], structure)


def _filenames(fn, filenames):
    """File names as a list of str: one name, a list of names, a string tensor of them, or a
    Dataset of them (as Dataset.list_files gives)."""
    if isinstance(filenames, Dataset):
        filenames = [name for name in filenames.as_numpy_iterator()]
    elif isinstance(filenames, _dtrain.Tensor):
        filenames = np.asarray(filenames.numpy(), dtype=object).reshape(-1).tolist()  # a scalar's numpy() is bytes
    elif isinstance(filenames, (str, bytes)) or hasattr(filenames, "__fspath__"):
        filenames = [filenames]
    names = []
    for name in np.asarray(filenames, dtype=object).reshape(-1).tolist():
        if isinstance(name, bytes):
            name = name.decode()
        elif hasattr(name, "__fspath__"):
            name = os.fspath(name)
        if not isinstance(name, str):
            raise TypeError(f"{fn}: file names are strings, got a {type(name).__name__}")
        names.append(name)
    if not names:
        raise ValueError(f"{fn}: no file names given")
    return names


class TextLineDataset(Dataset):
    """tf.data.TextLineDataset: the lines of text files, one string scalar each, without its
    line end ("\\n" or "\\r\\n"); empty lines are elements too. Files are read one after
    another (num_parallel_reads is accepted and reads them in that order still). Under a
    multi-worker strategy it is a file source: AutoShardPolicy.FILE gives each worker its
    files."""

    def __init__(self, filenames, compression_type=None, buffer_size=None, num_parallel_reads=None, name=None):
        del buffer_size, num_parallel_reads, name
        compression = (compression_type or "").upper()
        super().__init__(_data._Dataset.text_lines(_filenames("TextLineDataset", filenames), compression), _ONE)


class TFRecordDataset(Dataset):
    """tf.data.TFRecordDataset: the records of TFRecord files as TensorFlow writes them, one
    string scalar (the record's bytes) each; every record's length and bytes are checked
    against their masked CRC-32C, and a bad one is an error naming the file, the record and
    its offset. compression_type None, "" (uncompressed), "ZLIB" or "GZIP" (a compressed
    file is inflated as it is read). Files are read one after another, or with
    num_parallel_reads N > 1 N at a time, a record from each in turn (TensorFlow's
    interleave). Under a multi-worker strategy it is a file source, as TextLineDataset."""

    def __init__(self, filenames, compression_type=None, buffer_size=None, num_parallel_reads=None, name=None):
        del buffer_size, name
        compression = "" if compression_type is None else str(compression_type).upper()
        parallel = 0 if num_parallel_reads is None else int(num_parallel_reads)
        super().__init__(_data._Dataset.tfrecord(_filenames("TFRecordDataset", filenames), compression, parallel), _ONE)


def _next_pass(dataset):
    """The pass a new iterator over `dataset` (a Dataset or a distributed one) makes: each is
    the next epoch of its pipeline, so a shuffle with reshuffle_each_iteration gives each
    pass its own order, as in TensorFlow (a restored iterator resumes the pass it was saved
    in)."""
    passes = getattr(dataset, "_passes", 0)
    dataset._passes = passes + 1
    return passes


class IteratorBase:
    """What every iterator of the package shares: it is its own iterator, get_next is next."""

    def __iter__(self):
        return self

    def get_next(self):
        return next(self)


class DatasetIterator(IteratorBase):
    """A pass over a Dataset; tf.train.Checkpoint can save and restore its position."""

    def __init__(self, dataset):
        self._dataset = dataset
        self._cpp = dataset._cpp.make_iterator(_next_pass(dataset))

    def __next__(self):
        return self._dataset._element(self._cpp.next())
