"""tf.random: numbers drawn from dtrain's seed sequence, so that
tf.keras.utils.set_random_seed makes a program draw the same ones every run."""
import numpy as np

from . import _dtrain
from ._core import _dtype_name, float32


def _generator(seed):
    return np.random.default_rng(_dtrain.next_seed() if seed is None else seed)


def _shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


def normal(shape, mean=0.0, stddev=1.0, dtype=float32, seed=None, name=None):
    del name
    values = _generator(seed).normal(mean, stddev, _shape(shape)).astype(np.float32)
    return _dtrain.convert_to_tensor(values, _dtype_name(dtype))


def uniform(shape, minval=0, maxval=None, dtype=float32, seed=None, name=None):
    del name
    kind = _dtype_name(dtype)
    rng = _generator(seed)
    if kind in ("int32", "uint8"):
        if maxval is None:
            raise ValueError("random.uniform: an integer dtype needs maxval")
        values = rng.integers(int(minval), int(maxval), _shape(shape)).astype(np.int32 if kind == "int32" else np.uint8)
    else:
        values = rng.uniform(float(minval), 1.0 if maxval is None else float(maxval), _shape(shape)).astype(np.float32)
    return _dtrain.convert_to_tensor(values, kind)


def set_seed(seed):
    """tf.random.set_seed: the global seed, as tf.keras.utils.set_random_seed sets it (the
    initializers, tf.random's draws and fit's shuffling)."""
    from .keras import utils

    utils.set_random_seed(seed)
