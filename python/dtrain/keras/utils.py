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


class _Experimental:
    """tf.keras.utils.experimental."""

    class DatasetCreator:
        """fit's input as a function of an InputContext that makes the dataset, as
        ParameterServerStrategy's programs give it: each worker calls it for its own
        pipeline (give fit steps_per_epoch when the dataset repeats)."""

        def __init__(self, dataset_fn, input_options=None):
            if not callable(dataset_fn):
                raise TypeError(f"DatasetCreator: dataset_fn must be callable, got {type(dataset_fn).__name__}")
            del input_options  # dtrain's pipelines run in the worker's process
            self.dataset_fn = dataset_fn

        def __call__(self, input_context):
            from ..data import Dataset

            dataset = self.dataset_fn(input_context)
            if not isinstance(dataset, Dataset):
                raise TypeError(f"DatasetCreator: {getattr(self.dataset_fn, '__name__', 'dataset_fn')} returned a "
                                f"{type(dataset).__name__}, not a tf.data.Dataset")
            return dataset


experimental = _Experimental()


def _created_dataset(x):
    """fit's x when it is a DatasetCreator or a bare dataset_fn(input_context): the dataset
    it makes for this task's one pipeline."""
    from ..data import Dataset
    from ..distribute.parameter_server import InputContext

    if isinstance(x, _Experimental.DatasetCreator):
        return x(InputContext())
    if callable(x) and not isinstance(x, Dataset) and not hasattr(x, "__array__"):
        return _Experimental.DatasetCreator(x)(InputContext())
    return x
