"""tf.keras.regularizers: L1, L2, L1L2 (and the functions l1, l2, l1_l2). A layer keeps
one in its config; dtrain's layers add its penalty to model.losses and to fit's loss.
Called on a tensor, a regularizer gives the penalty itself."""
from .. import _dtrain

_ops = _dtrain.ops


class Regularizer:
    """Keras's base class; dtrain's layers take L1, L2 and L1L2 (a subclass of your own
    runs only where you call it yourself)."""

    class_name = None

    def __call__(self, x):
        raise NotImplementedError(f"{type(self).__name__}.__call__")

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class L1L2(Regularizer):
    """l1 * sum(|x|) + l2 * sum(x**2)."""

    class_name = "L1L2"

    def __init__(self, l1=0.0, l2=0.0):
        self.l1 = float(l1 or 0.0)
        self.l2 = float(l2 or 0.0)
        for name, value in (("l1", self.l1), ("l2", self.l2)):
            if not value >= 0.0:
                raise ValueError(f"{type(self).__name__}: {name} must be >= 0, got {value}")

    def __call__(self, x):
        total = _ops.multiply(_ops.reduce_sum(_ops.abs(x), None, False), self.l1) if self.l1 else None
        if self.l2:
            squares = _ops.multiply(_ops.reduce_sum(_ops.square(x), None, False), self.l2)
            total = squares if total is None else _ops.add(total, squares)
        return _dtrain.convert_to_tensor(0.0, "float32") if total is None else total

    def get_config(self):
        return {"l1": self.l1, "l2": self.l2}

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.get_config().items())})"


class L1(L1L2):
    class_name = "L1"

    def __init__(self, l1=0.01):
        super().__init__(l1=l1)

    def get_config(self):
        return {"l1": self.l1}


class L2(L1L2):
    class_name = "L2"

    def __init__(self, l2=0.01):
        super().__init__(l2=l2)

    def get_config(self):
        return {"l2": self.l2}


def l1_l2(l1=0.01, l2=0.01):
    """tf.keras's l1_l2: both factors 0.01 unless given."""
    return L1L2(l1=l1, l2=l2)


l1 = L1
l2 = L2

_BY_NAME = {"l1": L1, "l2": L2, "l1_l2": l1_l2, "L1": L1, "L2": L2, "L1L2": L1L2}


def serialize(regularizer):
    """Keras's {"class_name", "config"} form, which a layer's config holds."""
    if not isinstance(regularizer, L1L2):
        raise TypeError(f"regularizer: dtrain's layers take L1, L2 and L1L2, got {regularizer!r}")
    return {"class_name": regularizer.class_name, "config": regularizer.get_config()}


def deserialize(config):
    cls = _BY_NAME.get(config.get("class_name"))
    if cls is None or cls is l1_l2:
        raise ValueError(f"regularizer '{config.get('class_name')}' is not one dtrain has (L1, L2, L1L2)")
    return cls(**(config.get("config") or {}))


def get(identifier):
    """None, a name ("l1", "l2", "l1_l2"), a config dict or a regularizer."""
    if identifier is None or isinstance(identifier, L1L2):
        return identifier
    if isinstance(identifier, str):
        make = _BY_NAME.get(identifier)
        if make is None:
            raise ValueError(f"regularizer '{identifier}' is not one dtrain has (l1, l2, l1_l2)")
        return make()
    if isinstance(identifier, dict):
        return deserialize(identifier)
    raise TypeError(f"regularizer: dtrain's layers take L1, L2, L1L2 or their names, got {identifier!r}")
