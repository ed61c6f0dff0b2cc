"""tf.keras.layers. A layer here is its Keras config until a model is built from it, the
way the dtrain command builds one from a JSON file: so a model built from Python and the
same model in a config file get the same weights from the same seed.

Once its model is built, a layer answers for its dtrain layer (name, weights, call)."""
from .initializers import Initializer


def assign_all(owner, variables, weights):
    """Keras's set_weights: one array per variable, in order; `owner` names them in errors."""
    if len(weights) != len(variables):
        raise ValueError(f"{owner}: {len(weights)} arrays for {len(variables)} weights")
    for v, w in zip(variables, weights):
        v.assign(w)


def _keras_value(value):
    if isinstance(value, Initializer):
        return value.get_config()
    if isinstance(value, tuple):
        return list(value)
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
        self._config = {k: _keras_value(v) for k, v in config.items() if v is not None}
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
        return self._layer()(inputs, training)

    def __repr__(self):
        return f"<{self.class_name} '{self.name}'>"


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
