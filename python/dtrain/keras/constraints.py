"""tf.keras.constraints: MaxNorm, NonNeg, UnitNorm, MinMaxNorm. A layer keeps one in its
config; the optimizers apply it to the weight after each update, as Keras does. Called on
a tensor, a constraint gives the constrained values."""
from .. import _dtrain

_ops = _dtrain.ops
_EPSILON = 1e-7  # Keras's backend epsilon


def _axes(axis):
    return list(axis) if isinstance(axis, (list, tuple)) else [int(axis)]


def _norms(w, axis):
    return _ops.sqrt(_ops.reduce_sum(_ops.square(w), _axes(axis), True))


class Constraint:
    class_name = None

    def __call__(self, w):
        return w

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.get_config().items())})"


class MaxNorm(Constraint):
    """Each norm over `axis` at most max_value (a Dense kernel's axis 0: each unit's
    incoming weights; a Conv2D kernel's [0, 1, 2]: each filter)."""

    class_name = "MaxNorm"

    def __init__(self, max_value=2, axis=0):
        self.max_value = max_value
        self.axis = axis

    def __call__(self, w):
        norms = _norms(w, self.axis)
        desired = _ops.clip_by_value(norms, 0.0, float(self.max_value))
        return _ops.multiply(w, _ops.divide(desired, _ops.add(norms, _EPSILON)))

    def get_config(self):
        return {"max_value": self.max_value, "axis": self.axis}


class NonNeg(Constraint):
    class_name = "NonNeg"

    def __call__(self, w):
        return _ops.relu(w)


class UnitNorm(Constraint):
    class_name = "UnitNorm"

    def __init__(self, axis=0):
        self.axis = axis

    def __call__(self, w):
        return _ops.divide(w, _ops.add(_norms(w, self.axis), _EPSILON))

    def get_config(self):
        return {"axis": self.axis}


class MinMaxNorm(Constraint):
    class_name = "MinMaxNorm"

    def __init__(self, min_value=0.0, max_value=1.0, rate=1.0, axis=0):
        self.min_value = min_value
        self.max_value = max_value
        self.rate = rate
        self.axis = axis

    def __call__(self, w):
        norms = _norms(w, self.axis)
        clipped = _ops.clip_by_value(norms, float(self.min_value), float(self.max_value))
        desired = _ops.add(_ops.multiply(clipped, float(self.rate)), _ops.multiply(norms, 1.0 - float(self.rate)))
        return _ops.multiply(w, _ops.divide(desired, _ops.add(norms, _EPSILON)))

    def get_config(self):
        return {"min_value": self.min_value, "max_value": self.max_value, "rate": self.rate, "axis": self.axis}


max_norm = MaxNorm
non_neg = NonNeg
unit_norm = UnitNorm
min_max_norm = MinMaxNorm

_BY_NAME = {"max_norm": MaxNorm, "non_neg": NonNeg, "unit_norm": UnitNorm, "min_max_norm": MinMaxNorm,
            "MaxNorm": MaxNorm, "NonNeg": NonNeg, "UnitNorm": UnitNorm, "MinMaxNorm": MinMaxNorm}


def serialize(constraint):
    if type(constraint) not in (MaxNorm, NonNeg, UnitNorm, MinMaxNorm):
        raise TypeError(f"constraint: dtrain's layers take MaxNorm, NonNeg, UnitNorm and MinMaxNorm, got {constraint!r}")
    return {"class_name": constraint.class_name, "config": constraint.get_config()}


def deserialize(config):
    cls = _BY_NAME.get(config.get("class_name"))
    if cls is None:
        raise ValueError(f"constraint '{config.get('class_name')}' is not one dtrain has "
                         "(MaxNorm, NonNeg, UnitNorm, MinMaxNorm)")
    return cls(**(config.get("config") or {}))


def get(identifier):
    if identifier is None or isinstance(identifier, Constraint):
        return identifier
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier)
        if cls is None:
            raise ValueError(f"constraint '{identifier}' is not one dtrain has (max_norm, non_neg, unit_norm, "
                             "min_max_norm)")
        return cls()
    if isinstance(identifier, dict):
        return deserialize(identifier)
    raise TypeError(f"constraint: expected a tf.keras.constraints constraint or its name, got {identifier!r}")
