"""tf.keras.layers. A layer here is its Keras config until a model is built from it, the
way the dtrain command builds one from a JSON file: so a model built from Python and the
same model in a config file get the same weights from the same seed.

Once its model is built, a layer answers for its dtrain layer (name, weights, call)."""
import math
import re

import numpy as np

from .initializers import Initializer


def assign_all(owner, variables, weights):
    """Keras's set_weights: one array per variable, in order; `owner` names them in errors."""
    if len(weights) != len(variables):
        raise ValueError(f"{owner}: {len(weights)} arrays for {len(variables)} weights")
    for v, w in zip(variables, weights):
        v.assign(w)


def _keras_value(value, where):
    """A layer argument as its config holds it: numpy's scalars as Python's, tuples as
    lists; a number that is not finite (which JSON cannot hold) is a ValueError naming
    ``where``."""
    if isinstance(value, Initializer):
        return value.get_config()
    if callable(value):  # activation=tf.nn.relu: Keras saves it by name
        return value.__name__
    if isinstance(value, (tuple, list)):
        return [_keras_value(v, where) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value}")
    return value


class Layer:
    """A Keras layer: class_name and config, and after building, the dtrain layer."""

    class_name = None
    _args = ()  # positional arguments, in Keras's order

    def __init__(self, *args, **kwargs):
        if len(args) > len(self._args):
            raise TypeError(f"{type(self).__name__} takes at most {len(self._args)} positional arguments")
        config = dict(zip(self._args, args))
        for key in list(kwargs):
            if key in config:
                raise TypeError(f"{type(self).__name__}: {key} given twice")
        input_shape = kwargs.pop("input_shape", None)
        input_dim = kwargs.pop("input_dim", None)
        if input_dim is not None:
            input_shape = (input_dim,)
        batch_input_shape = kwargs.pop("batch_input_shape", None)
        if batch_input_shape is not None:
            input_shape = tuple(batch_input_shape)[1:]
        config.update(kwargs)
        self._input_shape = None if input_shape is None else tuple(input_shape)
        self._config = {k: _keras_value(v, f"{type(self).__name__}: {k}")
                        for k, v in config.items() if v is not None}
        self._built = None  # the dtrain layer, once a model is built

    def get_config(self):
        return dict(self._config)

    def _keras_json(self):
        return {"class_name": self.class_name, "config": dict(self._config)}

    # --- the built layer
    def _layer(self):
        if self._built is None:
            raise ValueError(f"{self.class_name} layer '{self.name}' is not built: add it to a model and build that")
        return self._built

    @property
    def name(self):
        return self._built.name if self._built is not None else self._config.get("name", "")

    @property
    def built(self):
        return self._built is not None and self._built.built

    @property
    def weights(self):
        return self._layer().variables if self._built is not None else []

    variables = weights

    @property
    def trainable_weights(self):
        return self._layer().trainable_variables if self._built is not None else []

    trainable_variables = trainable_weights

    @property
    def trainable(self):
        return self._built.trainable if self._built is not None else self._config.get("trainable", True)

    @trainable.setter
    def trainable(self, value):
        if self._built is not None:
            self._built.trainable = bool(value)
        else:
            self._config["trainable"] = bool(value)

    def get_weights(self):
        return [v.numpy() for v in self.weights]

    def set_weights(self, weights):
        assign_all(f"layer '{self.name}'", self.weights, weights)

    def __call__(self, inputs, training=False):
        if _symbolic(inputs):
            return self._call_symbolic(inputs)
        return self._layer()(inputs, training)

    # --- the functional API: calls on KerasTensors record the graph
    def _call_symbolic(self, inputs):
        if self._built is not None:
            raise ValueError(f"layer '{self.name}' belongs to a built model; make a new layer for a new graph")
        if "name" not in self._config:
            self._config["name"] = _unique_name(_snake(self.class_name))
        self._nodes = getattr(self, "_nodes", [])
        refs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        self._nodes.append(refs)
        return KerasTensor(self, self._config["name"], len(self._nodes) - 1)

    def _graph_json(self):
        nodes = [[[r.layer_name, r.node_index, 0, {}] for r in refs] for refs in getattr(self, "_nodes", [])]
        return {"class_name": self.class_name, "name": self._config["name"], "config": dict(self._config),
                "inbound_nodes": nodes}

    def __repr__(self):
        return f"<{self.class_name} '{self.name}'>"


_names = {}


def _unique_name(base):
    """Keras's layer names: dense, dense_1, dense_2, ... over the program."""
    n = _names.get(base, 0)
    _names[base] = n + 1
    return base if n == 0 else f"{base}_{n}"


def _snake(class_name):
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", class_name).lower()


def _symbolic(value):
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, KerasTensor) for v in value)
    return isinstance(value, KerasTensor)


class KerasTensor:
    """A symbolic output of a layer call in the functional API (or an Input)."""

    def __init__(self, layer, layer_name, node_index, shape=None):
        self._keras_layer = layer  # a Layer, or the Input itself
        self.layer_name = layer_name
        self.node_index = node_index
        self.shape = shape

    def __repr__(self):
        return f"<KerasTensor from '{self.layer_name}' node {self.node_index}>"


class Input(KerasTensor):
    """tf.keras.Input(shape=...): a functional model's input (and a Sequential's shape)."""

    def __init__(self, shape=None, batch_size=None, name=None, dtype=None, **kwargs):
        del batch_size
        if kwargs.get("batch_shape") is not None:
            shape = tuple(kwargs.pop("batch_shape"))[1:]
        if shape is None:
            raise ValueError("Input: give its shape (without the batch axis)")
        super().__init__(self, name or _unique_name("input"), 0, (None, *tuple(shape)))
        self.dtype = "float32" if dtype is None else str(getattr(dtype, "name", dtype))

    def _graph_json(self):
        return {"class_name": "InputLayer", "name": self.layer_name,
                "config": {"batch_input_shape": list(self.shape), "dtype": self.dtype, "name": self.layer_name},
                "inbound_nodes": []}


def _layer_class(name, args=(), doc=""):
    return type(name, (Layer,), {"class_name": name, "_args": args, "__doc__": doc})


Dense = _layer_class("Dense", ("units", "activation"), "Dense(units, activation=None, use_bias=True, ...)")
Dropout = _layer_class("Dropout", ("rate",), "Dropout(rate, seed=None)")
Flatten = _layer_class("Flatten")
Activation = _layer_class("Activation", ("activation",))
Reshape = _layer_class("Reshape", ("target_shape",))
Rescaling = _layer_class("Rescaling", ("scale", "offset"))
Conv2D = _layer_class("Conv2D", ("filters", "kernel_size", "strides", "padding"))
DepthwiseConv2D = _layer_class("DepthwiseConv2D", ("kernel_size", "strides", "padding"))
MaxPooling2D = _layer_class("MaxPooling2D", ("pool_size", "strides", "padding"))
AveragePooling2D = _layer_class("AveragePooling2D", ("pool_size", "strides", "padding"))
GlobalAveragePooling2D = _layer_class("GlobalAveragePooling2D")
BatchNormalization = _layer_class("BatchNormalization")
LayerNormalization = _layer_class("LayerNormalization")
ZeroPadding2D = _layer_class("ZeroPadding2D", ("padding",))
MaxPool2D = MaxPooling2D
AvgPool2D = AveragePooling2D


class InputLayer(Layer):
    class_name = "InputLayer"

    def __init__(self, input_shape=None, shape=None, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self._input_shape = tuple(shape if shape is not None else input_shape)

Add = _layer_class("Add")
Concatenate = _layer_class("Concatenate", ("axis",))
