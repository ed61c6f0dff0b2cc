"""tf.distribute.experimental.partitioners: how ParameterServerStrategy splits a variable
into shards along its first axis, by TensorFlow's rules (docs/parameter_server.md).
Called as TensorFlow calls them, partitioner(shape, dtype) gives the shards per axis."""
from .. import _dtrain
from .._core import _dtype_name

_P = _dtrain.distribute._Partitioner


class Partitioner:
    def __init__(self, cpp, *args):
        self._cpp = cpp
        self._args = args  # the constructor's: how pickle sends it to a worker

    def __reduce__(self):
        return type(self), self._args

    def __call__(self, shape, dtype):
        dims = [int(d) for d in shape]
        first = self._cpp.num_shards(dims, _dtype_name(dtype) or "float32")
        return [first] + [1] * (len(dims) - 1)

    def __repr__(self):
        return self._cpp.description


class FixedShardsPartitioner(Partitioner):
    """num_shards shards (one per row where a variable has fewer rows)."""

    def __init__(self, num_shards):
        super().__init__(_P.fixed_shards(int(num_shards)), num_shards)


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least min_shard_bytes, at most max_shards."""

    def __init__(self, min_shard_bytes=256 << 10, max_shards=1, bytes_per_string=16):
        del bytes_per_string  # dtrain's variables hold numbers only
        super().__init__(_P.min_size(int(min_shard_bytes), int(max_shards)), min_shard_bytes, max_shards)


class MaxSizePartitioner(Partitioner):
    """Shards of at most max_shard_bytes (one row each where a row is larger), at most
    max_shards when given."""

    def __init__(self, max_shard_bytes, max_shards=None, bytes_per_string=16):
        del bytes_per_string
        super().__init__(_P.max_size(int(max_shard_bytes), 0 if max_shards is None else int(max_shards)),
                         max_shard_bytes, max_shards)
