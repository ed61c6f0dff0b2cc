"""tf.data: Dataset pipelines run by dtrain's C++ threads.

Elements are tensors or tuples of tensors. Python functions given to from_generator, map
and filter run on the pipeline's threads, one call at a time per function, holding the GIL.
"""
import numpy as np

from . import _dtrain
from ._core import TensorSpec, _dtype_name, _raw_dtype_name, _whole

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


class _DistributeOptions:
    def __init__(self):
        self.auto_shard_policy = _data.AutoShardPolicy.AUTO


class Options:
    """tf.data.Options: of its fields, experimental_distribute.auto_shard_policy applies."""

    def __init__(self):
        self.experimental_distribute = _DistributeOptions()


def _flatten(value):
    """A tuple or list of components, or one component."""
    if isinstance(value, (tuple, list)):
        return list(value), True
    if isinstance(value, dict):
        raise TypeError("dtrain's datasets take tensors or tuples of tensors, not dicts")
    return [value], False


class Dataset:
    """tf.data.Dataset over dtrain's pipeline. Iterating gives tensors (or tuples of them)."""

    def __init__(self, cpp, is_tuple):
        self._cpp = cpp
        self._tuple = is_tuple  # None: by the number of components

    def _derive(self, cpp, is_tuple=...):
        return Dataset(cpp, self._tuple if is_tuple is ... else is_tuple)

    # --- sources
    @staticmethod
    def from_tensor_slices(tensors, name=None):
        del name
        parts, is_tuple = _flatten(tensors)
        return Dataset(_data._Dataset.from_tensor_slices(parts), is_tuple)

    @staticmethod
    def from_tensors(tensors, name=None):
        raise NotImplementedError("Dataset.from_tensors is not supported by dtrain; use from_tensor_slices")

    @staticmethod
    def from_generator(generator, output_types=None, output_shapes=None, args=None, output_signature=None, name=None):
        del name
        shapes = None
        if output_signature is not None:
            specs, is_tuple = _flatten(output_signature)
            dtypes = [_dtype_name(s.dtype if isinstance(s, TensorSpec) else s) for s in specs]
            shapes = [s.shape if isinstance(s, TensorSpec) else None for s in specs]
        elif output_types is not None:
            types, is_tuple = _flatten(output_types)
            dtypes = [_dtype_name(t) for t in types]
            if output_shapes is not None:
                shapes = list(output_shapes) if is_tuple else [output_shapes]
                if len(shapes) != len(dtypes):
                    raise ValueError(f"Dataset.from_generator: output_shapes has {len(shapes)} component(s), "
                                     f"output_types {len(dtypes)}")
                shapes = [None if s is None else tuple(s) for s in shapes]
        else:
            raise TypeError("Dataset.from_generator needs output_signature (or output_types)")
        make = generator if not args else (lambda: generator(*args))
        if shapes is not None and any(s is not None for s in shapes):
            unchecked = make
            make = lambda: _shapes_checked(unchecked(), shapes, is_tuple)  # noqa: E731
        return Dataset(_data._Dataset.from_generator(make, dtypes), is_tuple)

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
                                              (("start", start), ("stop", stop), ("step", step)))), False)

    # --- transformations
    def map(self, map_func, num_parallel_calls=None, deterministic=None, name=None):
        del name
        parallel = 0 if num_parallel_calls is None else int(num_parallel_calls)
        return self._derive(self._cpp.map(map_func, parallel, True if deterministic is None else bool(deterministic)), None)

    def filter(self, predicate, name=None):
        del name
        return self._derive(self._cpp.filter(predicate))

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
        if self._tuple or (self._tuple is None and len(parts) > 1):
            return tuple(parts)
        return parts[0]

    def __iter__(self):
        return DatasetIterator(self)

    def as_numpy_iterator(self):
        for element in self:
            yield tuple(t.numpy() for t in element) if isinstance(element, tuple) else element.numpy()


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
