"""tf.keras.optimizers: SGD, Adam, AdamW, RMSprop, Adagrad and learning-rate schedules."""
import copyreg

from .. import _dtrain

_o = _dtrain.keras.optimizers
Optimizer = _o.Optimizer
SGD = _o.SGD
Adam = _o.Adam
AdamW = _o.AdamW
RMSprop = _o.RMSprop
Adagrad = _o.Adagrad
schedules = _o.schedules

_BY_NAME = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adagrad": Adagrad}


def get(identifier):
    """An optimizer from a Keras name ('rmsprop', 'adam', 'sgd', ...), its config dict
    ({"class_name": "Adam", "config": {...}}) or an Optimizer."""
    if isinstance(identifier, Optimizer):
        return identifier
    inner = getattr(identifier, "inner_optimizer", None)
    if isinstance(inner, Optimizer):
        return inner  # a LossScaleOptimizer: its scale lives in the optimizer it wraps
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.lower())
        if cls is None:
            raise ValueError(f"optimizer '{identifier}' is not one dtrain has ({', '.join(_BY_NAME)})")
        return cls()
    if isinstance(identifier, dict) and "class_name" in identifier:
        return deserialize(identifier)
    raise TypeError(f"optimizer: expected a name or a tf.keras.optimizers.Optimizer, got {type(identifier).__name__}")


# The config keys Keras versions write that dtrain has no counterpart for: each is dropped
# at the values listed (its default), and any other value is an error naming it.
_INERT = {"name": None, "clipvalue": (None,), "use_ema": (False, None), "ema_momentum": None,
          "ema_overwrite_frequency": None, "jit_compile": None, "is_legacy_optimizer": None,
          "loss_scale_factor": (None,), "gradient_accumulation_steps": (None, 1), "decay": (0.0, None),
          "amsgrad": (False, None)}


def deserialize(config):
    """An optimizer from Keras's serialized form (a compile_config's "optimizer"); a
    LossScaleOptimizer's is its inner optimizer with the loss scale set."""
    name = str(config.get("class_name", "")).lower()
    if name == "lossscaleoptimizer":
        kwargs = dict(config.get("config") or {})
        inner = kwargs.pop("inner_optimizer", None)
        if not isinstance(inner, dict):
            raise ValueError("optimizer LossScaleOptimizer: its config has no inner_optimizer")
        # Keras 3 writes the base optimizer's keys too: its inert ones, and unset clipping.
        for key in [k for k in kwargs if k in _INERT or k in ("weight_decay", "clipnorm", "global_clipnorm")]:
            value = kwargs.pop(key)
            allowed = _INERT.get(key, (None,))
            if allowed is not None and value not in allowed:
                raise ValueError(f"optimizer LossScaleOptimizer: {key}={value!r} is not supported by dtrain "
                                 "(give it to the inner optimizer)")
        unknown = sorted(set(kwargs) - {"initial_scale", "dynamic_growth_steps", "dynamic"})
        if unknown:
            raise ValueError(f"optimizer LossScaleOptimizer: {', '.join(unknown)} is not supported by dtrain")
        optimizer = deserialize(inner)
        optimizer._set_loss_scale(bool(kwargs.get("dynamic", True)), float(kwargs.get("initial_scale", 2.0 ** 15)),
                                  int(kwargs.get("dynamic_growth_steps", 2000)))
        return optimizer
    cls = _BY_NAME.get(name)
    if cls is None:
        raise ValueError(f"optimizer '{config.get('class_name')}' is not one dtrain has ({', '.join(_BY_NAME)})")
    kwargs = dict(config.get("config") or {})
    for key, allowed in _INERT.items():
        if key not in kwargs:
            continue
        value = kwargs.pop(key)
        if allowed is not None and value not in allowed:
            raise ValueError(f"optimizer {config.get('class_name')}: {key}={value!r} is not supported by dtrain")
    if kwargs.get("weight_decay") is None:
        kwargs.pop("weight_decay", None)
    if isinstance(kwargs.get("learning_rate"), dict):
        raise ValueError(f"optimizer {config.get('class_name')}: a serialized learning-rate schedule is not read; "
                         "give the schedule object")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"optimizer {config.get('class_name')}: {str(e).splitlines()[0]} "
                         f"(given {sorted(kwargs)})") from None


def _from_json(text):
    return _o._from_json(text)


def _reduce(optimizer):
    """pickle's way to send an optimizer to another process (tf.distribute.Server's workers):
    its Keras JSON, with its learning-rate schedule; its slots stay where they are."""
    return _from_json, (_o._to_json(optimizer),)


for _cls in (SGD, Adam, AdamW, RMSprop, Adagrad):
    copyreg.pickle(_cls, _reduce)
