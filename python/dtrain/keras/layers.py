"""tf.keras.layers. A layer here is its Keras config until a model is built from it, the
way the dtrain command builds one from a JSON file: so a model built from Python and the
same model in a config file get the same weights from the same seed.

Once its model is built, a layer answers for its dtrain layer (name, weights, call). A layer
called on tensors outside a model (inside a layer of your own, say) becomes a dtrain layer
of its own at that first call.

A subclass of Layer that defines call() is a layer of your own, as in Keras: build() makes
its weights with add_weight(), call() computes with tf's ops and other layers. dtrain runs
it as one of its layers (fit, evaluate, checkpoints, every strategy), its Python under the
GIL; the built-in layers it calls run in C++ without it."""
import inspect
import json
import math
import re

import numpy as np

from .. import _dtrain
from . import constraints as constraints_module
from . import regularizers as regularizers_module
from .initializers import Initializer

_k = _dtrain.keras


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
    if isinstance(value, regularizers_module.Regularizer):
        return regularizers_module.serialize(value)
    if isinstance(value, constraints_module.Constraint):
        return constraints_module.serialize(value)
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
        if type(self).class_name is None:  # a layer of your own
            _init_own(self, type(self).__name__, *args, **kwargs)
            return
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
        if _is_own(self):
            raise NotImplementedError(f"layer '{self.name}' ({type(self).__name__}) is written in Python and has no "
                                      "Keras JSON dtrain can read; save the model's weights or a checkpoint")
        return {"class_name": self.class_name, "config": dict(self._config)}

    def _standalone(self):
        """This layer's dtrain layer, made now where no model made it."""
        if self._built is None:
            if _is_own(self):
                return _own_layer(self)
            if "name" not in self._config:
                self._config["name"] = _unique_name(_snake(self.class_name))
            self._built = _k._layer_from_config(json.dumps(self._keras_json()))
        return self._built

    # --- layers of your own (Keras's subclassing API)
    def build(self, input_shape):
        """Makes the weights (add_weight) for inputs of input_shape; the first call runs it."""
        del input_shape

    def call(self, inputs, training=None):
        raise NotImplementedError(f"{type(self).__name__}: a layer of your own defines call(self, inputs)")

    def add_weight(self, *args, **kwargs):
        return _add_weight(self, *args, **kwargs)

    def __setattr__(self, name, value):
        _track(self, name, value)
        object.__setattr__(self, name, value)

    def _dtrain_build(self, input_shape):
        _dtrain_build(self, input_shape)

    def _dtrain_call(self, x, training):
        return _dtrain_call(self, x, training)

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

    @built.setter
    def built(self, value):  # a build() of your own may say self.built = True, as Keras's do
        del value

    # Keras's names for a built-in layer's weights: layer.kernel, layer.bias, ...
    _WEIGHT_NAMES = frozenset(("kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance", "embeddings",
                               "depthwise_kernel", "pointwise_kernel"))

    def __getattr__(self, name):  # only for names the instance and class lack
        if name in Layer._WEIGHT_NAMES:
            built = self.__dict__.get("_built")
            for v in built.variables if built is not None else []:
                if v.name.rsplit("/", 1)[-1] == name:
                    return v
            raise AttributeError(f"{self.class_name} layer '{self.name}' has no {name}"
                                 + (" yet: it is made when the layer is built" if built is None else ""))
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

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

    @property
    def losses(self):
        """The penalties of the layer's regularizers: each weight's, and the activity
        regularizer's of the last call."""
        return self._layer().losses if self._built is not None else []

    def get_weights(self):
        return [v.numpy() for v in self.weights]

    def set_weights(self, weights):
        assign_all(f"layer '{self.name}'", self.weights, weights)

    def __call__(self, inputs, training=False, **kwargs):
        if kwargs:
            raise TypeError(f"layer '{self.name}': unexpected argument(s) {', '.join(sorted(kwargs))}")
        if _symbolic(inputs):
            return self._call_symbolic(inputs)
        return self._standalone()(inputs, bool(training))

    # --- the functional API: calls on KerasTensors record the graph
    def _call_symbolic(self, inputs):
        if _is_own(self):
            raise NotImplementedError(f"layer '{self.name}' ({type(self).__name__}) is written in Python: use it in a "
                                      "Sequential or a subclassed Model; a functional graph holds only built-in layers")
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


# --- what layers and models of your own share (Model uses these too)

def _is_own(layer):
    return getattr(layer, "_own", False)


def _init_own(owner, class_name, trainable=True, name=None, dtype=None, dynamic=False, activity_regularizer=None,
              input_shape=None, input_dim=None, batch_input_shape=None, **kwargs):
    """Keras's Layer.__init__ arguments for a layer or model of your own."""
    del dynamic
    if kwargs:
        raise TypeError(f"{class_name}: unexpected argument(s) {', '.join(sorted(kwargs))}")
    if dtype not in (None, "float32") and getattr(dtype, "name", None) != "float32":
        raise NotImplementedError(f"{class_name}(dtype={dtype!r}): a layer of your own computes in float32 in dtrain")
    object.__setattr__(owner, "_own", True)
    object.__setattr__(owner, "_sublayers", [])
    object.__setattr__(owner, "_tracked", set())
    if input_dim is not None:
        input_shape = (input_dim,)
    if batch_input_shape is not None:
        input_shape = tuple(batch_input_shape)[1:]
    owner._input_shape = None if input_shape is None else tuple(input_shape)
    object.__setattr__(owner, "_auto_name", name is None)
    object.__setattr__(owner, "_sub_names", {})
    owner._config = {"name": name or _unique_name(_snake(class_name)), "trainable": bool(trainable)}
    owner._activity_regularizer = regularizers_module.get(activity_regularizer)
    owner._built = None


def _own_layer(owner):
    """The dtrain layer that runs owner's build and call (made once)."""
    if owner._built is None:
        # A model's own layer is named after its class, not the model (classifier_1), so
        # that every instance names its weights and random streams alike.
        name = _snake(type(owner).__name__) if hasattr(owner, "_cpp") else owner._config["name"]
        built = _k._PyLayer(owner, name, type(owner).__name__)
        if owner._activity_regularizer is not None:
            built._set_activity_regularizer(json.dumps(regularizers_module.serialize(owner._activity_regularizer)))
        if not owner._config.get("trainable", True):
            built.trainable = False
        object.__setattr__(owner, "_built", built)
    return owner._built


def _layers_in(value):
    if isinstance(value, Layer) or getattr(value, "_own", False):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _layers_in(item)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _layers_in(item)]
    return []


def _track(owner, name, value):
    """Keras's attribute tracking: layers assigned to a layer of your own (alone, in lists,
    tuples or dicts) are its sublayers."""
    if name.startswith("_") or not _is_own(owner):
        return
    for layer in _layers_in(value):
        if layer is not owner and not any(layer is s for s in owner._sublayers):
            owner._sublayers.append(layer)
            _name_sublayer(owner, layer)


def _name_sublayer(owner, layer):
    """A sublayer not named by its maker is named in its owner's order (dense, dense_1, ...;
    under a layer of your own inside a model, "<layer>/dense"), so that every instance of a
    model names its weights alike and a checkpoint of one restores into another."""
    if getattr(layer, "_built", None) is not None:
        return
    if _is_own(layer):
        if not layer._auto_name:
            return
    elif "name" in layer._config:
        return
    base = _snake(layer.class_name if layer.class_name else type(layer).__name__)
    count = owner._sub_names.get(base, 0)
    owner._sub_names[base] = count + 1
    name = base if count == 0 else f"{base}_{count}"
    if not hasattr(owner, "_cpp"):  # a layer (not a model) prefixes its sublayers' names with its own
        name = f"{owner._config['name']}/{name}"
    layer._config["name"] = name


def _track_built(owner):
    """Tells owner's dtrain layer of the sublayers built so far (their weights become its)."""
    built = owner._built
    for sub in owner._sublayers:
        cpp = getattr(sub, "_built", None)
        if cpp is not None and id(cpp) not in owner._tracked:
            built._track(cpp)
            owner._tracked.add(id(cpp))


def _dtrain_build(owner, input_shape):
    owner.build(tuple(input_shape))
    _track_built(owner)


def _takes_training(call):
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False
    return "training" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _dtrain_call(owner, x, training):
    y = owner.call(x, training=bool(training)) if _takes_training(owner.call) else owner.call(x)
    _track_built(owner)
    if isinstance(y, (list, tuple, dict)):
        raise NotImplementedError(f"{type(owner).__name__}.call returned a {type(y).__name__}; "
                                  "a layer or model of your own returns one tensor in dtrain")
    return y if isinstance(y, _dtrain.Tensor) else _dtrain.convert_to_tensor(y, "float32")


_INITIALIZER_NAMES = {"glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "zeros", "ones",
                      "random_normal", "random_uniform", "truncated_normal"}


def _add_weight(owner, *args, shape=None, initializer=None, dtype=None, trainable=True, regularizer=None,
                constraint=None, name=None, **kwargs):
    """Keras's add_weight, with either Keras 2's order (name, shape, ...) or Keras 3's
    (shape, initializer, ...)."""
    for key in ("use_resource", "synchronization", "aggregation", "autocast", "experimental_autocast", "caching_device",
                "partitioner"):
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"add_weight: unexpected argument(s) {', '.join(sorted(kwargs))}")
    # Keras 2: add_weight(name, shape, dtype, initializer, ...); Keras 3: (shape, initializer, dtype, ...).
    order = ("name", "shape", "dtype", "initializer") if args and isinstance(args[0], str) else \
        ("shape", "initializer", "dtype")
    if len(args) > len(order):
        raise TypeError("add_weight: give the arguments after shape and initializer by name")
    given = dict(zip(order, args))
    name, shape = given.get("name", name), given.get("shape", shape)
    dtype, initializer = given.get("dtype", dtype), given.get("initializer", initializer)
    if dtype is not None and getattr(dtype, "name", dtype) not in ("float32",):
        raise NotImplementedError(f"add_weight(dtype={dtype!r}): dtrain's weights are float32")
    shape = [] if shape is None else [int(d) for d in shape]
    count = owner.__dict__.get("_weights_made", 0)
    object.__setattr__(owner, "_weights_made", count + 1)
    if name is None:
        name = "variable" if count == 0 else f"variable_{count}"
    seed = None
    if initializer is None:
        initializer = "glorot_uniform"
    if isinstance(initializer, Initializer):
        seed = initializer.config.get("seed")
        initializer = initializer if callable(initializer) else initializer.class_name
    if isinstance(initializer, str):
        snake = _snake(initializer) if initializer[:1].isupper() else initializer
        snake = {"random_normal": "random_normal", "normal": "random_normal", "uniform": "random_uniform",
                 "zero": "zeros", "one": "ones"}.get(snake, snake)
        if snake not in _INITIALIZER_NAMES:
            raise ValueError(f"add_weight '{name}': initializer '{initializer}' is not one dtrain has "
                             f"({', '.join(sorted(_INITIALIZER_NAMES))}) ; give a function of (shape, dtype) instead")
        values = snake
    elif callable(initializer):
        values = np.asarray(initializer(tuple(shape), dtype="float32"), dtype=np.float32).reshape(shape)
    else:
        values = np.asarray(initializer, dtype=np.float32).reshape(shape)
    reg = regularizers_module.get(regularizer)
    con = constraints_module.get(constraint)
    return _own_layer(owner)._add_weight(
        name, shape, values, seed, bool(trainable),
        json.dumps(None if reg is None else regularizers_module.serialize(reg)),
        json.dumps(None if con is None else constraints_module.serialize(con)))


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
Conv1D = _layer_class("Conv1D", ("filters", "kernel_size", "strides", "padding"),
                      "Conv1D(filters, kernel_size, strides=1, padding='valid', dilation_rate=1, ...): over sequences "
                      "[batch, steps, channels], kernel [kernel_size, channels, filters] as Keras keeps it")
MaxPooling1D = _layer_class("MaxPooling1D", ("pool_size", "strides", "padding"))
AveragePooling1D = _layer_class("AveragePooling1D", ("pool_size", "strides", "padding"))
MaxPool1D = MaxPooling1D
AvgPool1D = AveragePooling1D
CategoryEncoding = _layer_class("CategoryEncoding", ("num_tokens", "output_mode"),
                                "CategoryEncoding(num_tokens, output_mode='multi_hot'): integer ids as one_hot, "
                                "multi_hot or count vectors")
RandomFlip = _layer_class("RandomFlip", ("mode", "seed"),
                          "RandomFlip(mode='horizontal_and_vertical', seed=None): each image flipped with probability "
                          "1/2 per direction while training; the identity at inference")
RandomRotation = _layer_class("RandomRotation", ("factor", "fill_mode", "interpolation", "seed", "fill_value"),
                              "RandomRotation(factor, fill_mode='reflect', interpolation='bilinear', seed=None, "
                              "fill_value=0.0): each image turned by a random fraction of a full turn in [-factor, "
                              "factor] (or a (lower, upper) pair) while training")
RandomCrop = _layer_class("RandomCrop", ("height", "width", "seed"),
                          "RandomCrop(height, width, seed=None): a random window of each image while training, the "
                          "centre one at inference")


class Normalization(Layer):
    """tf.keras.layers.Normalization(axis=-1, mean=None, variance=None, invert=False):
    (x - mean) / sqrt(variance) per index of the kept axes (axis: an int, a tuple of them
    counted with the batch as 0, or None for one mean and variance over everything), with
    the statistics given or found by adapt(data) (an array, a tensor or a Dataset of
    batches). Until then the layer is the identity (mean 0, variance 1), as Keras's starts."""

    class_name = "Normalization"
    _args = ("axis", "mean", "variance", "invert")

    def __init__(self, axis=-1, mean=None, variance=None, invert=False, **kwargs):
        if axis is not None and not isinstance(axis, int):
            axis = [int(a) for a in axis]
            axis = axis[0] if len(axis) == 1 else axis
        if axis == 0 or (isinstance(axis, list) and 0 in axis):
            raise ValueError("Normalization: axis may not be 0 (the batch)")
        stats = [None if v is None else np.asarray(v, np.float64).reshape(-1).tolist() for v in (mean, variance)]
        super().__init__(axis=axis, mean=stats[0], variance=stats[1], invert=bool(invert), **kwargs)
        self._config["axis"] = axis  # None too: one mean and variance over everything

    def _features(self, values):
        """values [batch, ...] as rows of the kept axes' indices: [rows, features]."""
        axis = self._config["axis"]
        if axis is None:
            return values.reshape(-1, 1)
        rank = max(values.ndim, 1)
        given = [axis] if isinstance(axis, int) else axis
        if any(not -rank <= a < rank for a in given):
            raise ValueError(f"Normalization.adapt: axis {axis} is outside data of rank {values.ndim}")
        kept = sorted(a % rank for a in given)
        if 0 in kept and rank > 1:
            raise ValueError(f"Normalization.adapt: axis {axis} takes the batch axis of data of rank {values.ndim}")
        moved = np.moveaxis(values.reshape(values.shape or (1,)), kept, range(rank - len(kept), rank))
        return moved.reshape(-1, int(np.prod([moved.shape[d] for d in range(rank - len(kept), rank)])))

    def adapt(self, data, batch_size=None, steps=None):
        """The mean and variance of every feature over all of data's other axes (Keras's
        adapt); a Dataset is read once (steps: at most that many of its elements)."""
        del batch_size
        from ..data import Dataset

        count, mean, m2 = 0, None, None
        if isinstance(data, Dataset):
            parts = (e for i, e in enumerate(data) if steps is None or i < steps)
        else:
            parts = iter([data])
        for part in parts:
            if isinstance(part, (tuple, list, dict)):
                raise ValueError("Normalization.adapt: give it the features alone (a Dataset of (x, y) pairs: "
                                 "map it to x first)")
            values = self._features(np.asarray(part.numpy() if hasattr(part, "numpy") else part, dtype=np.float64))
            n = values.shape[0]
            if n == 0:
                continue
            batch_mean = values.mean(axis=0)
            batch_m2 = ((values - batch_mean) ** 2).sum(axis=0)
            if mean is None:
                count, mean, m2 = n, batch_mean, batch_m2
            else:  # Chan et al.'s pairwise update
                if batch_mean.shape != mean.shape:
                    raise ValueError(f"Normalization.adapt: batches of {mean.shape[0]} and {batch_mean.shape[0]} features")
                delta = batch_mean - mean
                total = count + n
                mean = mean + delta * n / total
                m2 = m2 + batch_m2 + delta ** 2 * count * n / total
                count = total
        if mean is None:
            raise ValueError("Normalization.adapt: the data holds no values")
        variance = m2 / count
        self._config["mean"] = mean.tolist()
        self._config["variance"] = variance.tolist()
        if self._built is not None:
            self._built.set_statistics(mean.astype(np.float32).tolist(), variance.astype(np.float32).tolist())


Embedding = _layer_class("Embedding", ("input_dim", "output_dim"),
                         "Embedding(input_dim, output_dim, embeddings_initializer='uniform', ...): ids to vectors")
GlobalAveragePooling1D = _layer_class("GlobalAveragePooling1D")
GlobalAvgPool1D = GlobalAveragePooling1D
PositionEmbedding = _layer_class("PositionEmbedding", ("sequence_length",),
                                 "keras_hub.layers.PositionEmbedding(sequence_length): learned position vectors, "
                                 "added to the input by the caller (x + PositionEmbedding(n)(x))")


class MultiHeadAttention(Layer):
    """tf.keras.layers.MultiHeadAttention(num_heads, key_dim, value_dim=None, dropout=0.0,
    use_bias=True, output_shape=None, ...), called as Keras calls it: mha(query, value,
    key=None, attention_mask=None, return_attention_scores=False, use_causal_mask=False).
    return_attention_scores=True (on arrays) also gives the weights [batch, heads, queries,
    keys], computed apart from the fused attention and without a gradient."""

    class_name = "MultiHeadAttention"
    _args = ("num_heads", "key_dim", "value_dim", "dropout", "use_bias", "output_shape")

    def __call__(self, query, value=None, key=None, attention_mask=None, return_attention_scores=False,
                 training=None, use_causal_mask=False, **kwargs):
        if kwargs:
            raise TypeError(f"layer '{self.name}': unexpected argument(s) {', '.join(sorted(kwargs))}")
        if value is None:
            raise TypeError(f"layer '{self.name}': MultiHeadAttention is called on a query and a value")
        tensors = [query, value] + ([] if key is None else [key])
        if _symbolic(tensors):
            if return_attention_scores:
                raise NotImplementedError(
                    f"layer '{self.name}': return_attention_scores=True on a functional graph's tensors is not "
                    "supported by dtrain (a node has one output); call the layer on arrays to get the scores")
            if attention_mask is not None and not isinstance(attention_mask, KerasTensor):
                raise TypeError(f"layer '{self.name}': on a functional graph's tensors, attention_mask is one of "
                                "the graph's tensors too (an Input of shape (queries, keys))")
            node = len(getattr(self, "_nodes", []))
            if use_causal_mask:
                self._causal = getattr(self, "_causal", set()) | {node}
            if attention_mask is not None:
                self._attention_masks = {**getattr(self, "_attention_masks", {}), node: attention_mask}
            return self._call_symbolic(tensors)
        layer = self._standalone()
        # With return_attention_scores, also the weights [batch, heads, queries, keys],
        # computed apart from the fused attention: for looking at, without a gradient.
        return _k._attend(layer, query, value, key, attention_mask, bool(use_causal_mask), bool(training),
                          bool(return_attention_scores))

    def _graph_json(self):
        entry = super()._graph_json()
        for node in getattr(self, "_causal", ()):
            entry["inbound_nodes"][node][0][3]["use_causal_mask"] = True
        for node, mask in getattr(self, "_attention_masks", {}).items():
            entry["inbound_nodes"][node][0][3]["attention_mask"] = [mask.layer_name, mask.node_index, 0]
        return entry


class InputLayer(Layer):
    class_name = "InputLayer"

    def __init__(self, input_shape=None, shape=None, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self._input_shape = tuple(shape if shape is not None else input_shape)

Add = _layer_class("Add")
Concatenate = _layer_class("Concatenate", ("axis",))


from .text_vectorization import TextVectorization  # noqa: E402 (after Layer, which it does not derive from)
