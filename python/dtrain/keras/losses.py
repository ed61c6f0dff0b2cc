"""tf.keras.losses: the classes (called as loss(y_true, y_pred)) and the functions, which
return one loss per example."""
import copyreg

from .. import _dtrain

_l = _dtrain.keras.losses
Loss = _l.Loss
SparseCategoricalCrossentropy = _l.SparseCategoricalCrossentropy
CategoricalCrossentropy = _l.CategoricalCrossentropy
MeanSquaredError = _l.MeanSquaredError


class Reduction:
    AUTO = "auto"
    NONE = "none"
    SUM = "sum"
    SUM_OVER_BATCH_SIZE = "sum_over_batch_size"


def sparse_categorical_crossentropy(y_true, y_pred, from_logits=False, axis=-1):
    del axis
    return SparseCategoricalCrossentropy(from_logits=from_logits, reduction="none")(y_true, y_pred)


def categorical_crossentropy(y_true, y_pred, from_logits=False, label_smoothing=0.0, axis=-1):
    del axis
    return CategoricalCrossentropy(from_logits=from_logits, label_smoothing=label_smoothing, reduction="none")(y_true, y_pred)


def mean_squared_error(y_true, y_pred):
    return MeanSquaredError(reduction="none")(y_true, y_pred)


mse = MSE = mean_squared_error

_BY_NAME = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "mse": MeanSquaredError,
}
_BY_FUNCTION = {
    sparse_categorical_crossentropy: SparseCategoricalCrossentropy,
    categorical_crossentropy: CategoricalCrossentropy,
    mean_squared_error: MeanSquaredError,
}


def get(identifier):
    """A Loss from a Keras name, one of the loss functions above, or a Loss."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.lower())
        if cls is None:
            raise ValueError(f"loss '{identifier}' is not one dtrain has ({', '.join(sorted(_BY_NAME))})")
        return cls()
    cls = _BY_FUNCTION.get(identifier)
    if cls is not None:
        return cls()
    raise TypeError(f"loss: dtrain trains with its own losses (a name or a tf.keras.losses.Loss), "
                    f"not the Python function {getattr(identifier, '__name__', identifier)!r}")


def _from_json(text):
    return _l._from_json(text)


def _reduce(loss):
    """pickle's way to send a loss to another process: its JSON (name, from_logits, ...)."""
    return _from_json, (_l._to_json(loss),)


for _cls in (SparseCategoricalCrossentropy, CategoricalCrossentropy, MeanSquaredError):
    copyreg.pickle(_cls, _reduce)
