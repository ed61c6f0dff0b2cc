"""tf.keras.utils."""
from .. import _dtrain

_seed = [0]


def set_random_seed(seed):
    """Seeds every layer's initializer drawn afterwards, tf.random's draws, and the order in
    which fit shuffles, so that a program trains the same way every run."""
    _seed[0] = int(seed)
    _dtrain.set_random_seed(int(seed))


def _fit_seed():
    return _seed[0]


def to_categorical(y, num_classes=None, dtype="float32"):
    import numpy as np

    y = np.asarray(y, dtype=np.int64).reshape(-1)
    n = int(y.max()) + 1 if num_classes is None else int(num_classes)
    out = np.zeros((y.size, n), dtype=dtype)
    out[np.arange(y.size), y] = 1
    return out
