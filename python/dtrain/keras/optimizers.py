"""tf.keras.optimizers: SGD, Adam, AdamW and learning-rate schedules."""
from .. import _dtrain

_o = _dtrain.keras.optimizers
Optimizer = _o.Optimizer
SGD = _o.SGD
Adam = _o.Adam
AdamW = _o.AdamW
schedules = _o.schedules

_BY_NAME = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def get(identifier):
    """An optimizer from a Keras name ('adam', 'sgd', 'adamw') or an Optimizer."""
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.lower())
        if cls is None:
            raise ValueError(f"optimizer '{identifier}' is not one dtrain has (sgd, adam, adamw)")
        return cls()
    raise TypeError(f"optimizer: expected a name or a tf.keras.optimizers.Optimizer, got {type(identifier).__name__}")
