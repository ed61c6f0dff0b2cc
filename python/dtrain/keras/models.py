"""tf.keras.Model and Sequential over dtrain's Model.

A Sequential becomes a dtrain model (from its Keras JSON, as the dtrain command makes one)
when it is first built, compiled, called or trained, under the strategy whose scope was
open when the Sequential was made: its weights then belong to that strategy, as in
TensorFlow.

A subclass of Model that defines call() is a model of your own (Keras's subclassing API):
its layers are the attributes it assigns, its call() runs as one dtrain layer (under the
GIL; the built-in layers it calls run in C++ without it), and fit, evaluate, predict,
custom loops, checkpoints and every strategy take it as they take any model."""
import json
import sys

import numpy as np

from .. import _dtrain
from .._core import _whole
from . import callbacks as callbacks_module
from . import layers as layers_module
from . import losses as losses_module
from . import metrics as metrics_module
from . import optimizers as optimizers_module
from . import utils

_k = _dtrain.keras
_d = _dtrain.distribute


class Model:
    """A Keras model. Make one as Sequential([...]), or load one with load_model."""

    def __init__(self, *args, **kwargs):
        from .. import distribute

        own = type(self).call is not Model.call
        if own:  # a model of your own: Layer's arguments (name, trainable, ...)
            if args:
                raise TypeError(f"{type(self).__name__}: Model.__init__ of a subclass takes keyword arguments only")
            layers_module._init_own(self, type(self).__name__, **kwargs)
            kwargs = {"name": self._config["name"]}
        else:
            object.__setattr__(self, "_own", False)
        inputs = args[0] if len(args) > 0 else kwargs.pop("inputs", None)
        outputs = args[1] if len(args) > 1 else kwargs.pop("outputs", None)
        self._graph = None
        if inputs is not None or outputs is not None:
            self._graph = _Graph(inputs, outputs)

        self._name = kwargs.get("name") or "model"
        self._cpp = None
        self._backend = _d._current_backend()
        self._strategy = distribute.get_strategy()
        self._strategy._models.add(self)
        self._layers = []
        self._steps_per_execution = 1
        self._optimizer = None
        self._loss = None
        if self._graph is not None:
            self._layers = self._graph.layers
            self._model()  # built now, as Keras builds a functional model

    # --- a model of your own (Keras's subclassing API)
    def call(self, inputs, training=None):
        raise NotImplementedError("Model.call: a model of your own defines call(self, inputs, training=None)")

    def build(self, input_shape):
        """Builds the model for inputs of input_shape (the batch axis first)."""
        model = self._model()
        if model.built:
            return
        scope = _d._Scope(self._backend)
        scope.enter()
        try:
            model.build([int(d) for d in tuple(input_shape)[1:]])
        finally:
            scope.exit()

    def add_weight(self, *args, **kwargs):
        return layers_module._add_weight(self, *args, **kwargs)

    def __setattr__(self, name, value):
        layers_module._track(self, name, value)
        object.__setattr__(self, name, value)

    def _dtrain_build(self, input_shape):
        # The model's own build(), when it has one, gets the input shape, as in Keras.
        if type(self).build is not Model.build:
            type(self).build(self, tuple(input_shape))
        layers_module._track_built(self)

    def _dtrain_call(self, x, training):
        return layers_module._dtrain_call(self, x, training)

    @classmethod
    def _wrap(cls, cpp):
        model = Model.__new__(Model)
        Model.__init__(model, name=cpp.name)
        model._cpp = cpp
        for built in cpp.layers:
            layer = layers_module.Layer()
            layer.class_name = built.class_name
            layer._built = built
            model._layers.append(layer)
        return model

    # --- the dtrain model
    def _keras_json(self):
        if self._own:
            raise NotImplementedError(f"model '{self.name}' ({type(self).__name__}) is written in Python and has no "
                                      "Keras JSON; save its weights (save_weights) or a checkpoint")
        if self._graph is None:
            raise TypeError("Model() needs inputs and outputs (the functional API), or use Sequential")
        return self._graph.keras_json(self._name)

    def _make_cpp(self):
        if self._own:
            return _k._sequential(self._name, [layers_module._own_layer(self)])
        return _k._Model.from_json(json.dumps(self._keras_json()))

    def _model(self):
        if self._cpp is None:
            scope = _d._Scope(self._backend)
            scope.enter()
            try:
                self._cpp = self._make_cpp()
            finally:
                scope.exit()
            if self._graph is not None:
                by_name = {built.name: built for built in self._cpp.layers}
                for layer in self._layers:
                    layer._built = by_name[layer._config["name"]]
            elif self._own:
                pass  # its layers are built by its call
            else:
                for layer, built in zip(self._layers, self._cpp.layers):
                    layer._built = built
        return self._cpp

    def _built_model(self, inputs):
        model = self._model()
        if self._strategy._pending and self._strategy._build_in_replica(self, lambda: self._build_for(inputs)):
            return model
        if not model.built:
            self._build_for(inputs)
        return model

    def _build_for(self, inputs):
        if not self._model().built:
            self.build((None, *_dtrain.convert_to_tensor(inputs).shape[1:]))

    @property
    def built(self):
        return self._cpp is not None and self._cpp.built

    @property
    def name(self):
        return self._cpp.name if self._cpp is not None else self._name

    @property
    def layers(self):
        if self._own:
            return list(self._sublayers)
        self._model()
        return list(self._layers)

    @property
    def weights(self):
        return self._model().variables

    variables = weights

    @property
    def trainable_variables(self):
        return self._model().trainable_variables

    trainable_weights = trainable_variables

    @property
    def losses(self):
        """Keras's model.losses: the layers' regularization penalties, as scalar tensors
        (recorded by live tapes, so a custom loop can add tf.add_n(model.losses))."""
        return list(self._model().losses)

    @property
    def stop_training(self):
        return self._model().stop_training

    @stop_training.setter
    def stop_training(self, value):
        self._model().stop_training = bool(value)

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def input_shape(self):
        shape = self._model().input_shape
        return None if shape is None else (None, *shape)

    @property
    def output_shape(self):
        return (None, *self._model().output_shape[1:])

    @property
    def distribute_strategy(self):
        from .. import distribute

        return distribute.get_strategy()

    def count_params(self):
        return self._model().count_params()

    def get_weights(self):
        return [v.numpy() for v in self.weights]

    def set_weights(self, weights):
        layers_module.assign_all(f"model '{self.name}'", self.weights, weights)

    def summary(self, print_fn=None, **kwargs):
        del kwargs
        (print_fn or print)(self._model().summary())

    def to_json(self, **kwargs):
        del kwargs
        if self._own:
            self._keras_json()  # says why
        return self._model().to_json(2)

    # --- training
    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None, weighted_metrics=None,
                run_eagerly=None, steps_per_execution=None, jit_compile=None, **kwargs):
        """optimizer and loss as Keras names or objects; metrics as names or Metric objects.
        A model of several outputs takes a loss for each (a list in the outputs' order, or a
        dict keyed by output name; one loss is every output's), loss_weights likewise, and
        metrics as a list for every output, a list of lists, or a dict by output name."""
        del run_eagerly, jit_compile
        if weighted_metrics is not None:
            raise NotImplementedError("compile(weighted_metrics=...) is not supported by dtrain")
        if kwargs:
            raise TypeError("compile: unexpected argument(s) " + ", ".join(sorted(kwargs)))
        if optimizer is None:
            optimizer = "rmsprop"
        if loss is None:
            raise ValueError("compile: a loss is needed (a name such as 'sparse_categorical_crossentropy', or a Loss)")
        self._optimizer = optimizers_module.get(optimizer)
        self._steps_per_execution = (1 if steps_per_execution is None
                                     else _whole("compile", "steps_per_execution", steps_per_execution, int32=True))
        if self._steps_per_execution < 1:
            raise ValueError(f"compile: steps_per_execution must be >= 1, got {self._steps_per_execution}")
        model = self._model()
        outputs = list(model.output_names)
        several = model.num_outputs > 1 or isinstance(loss, (list, tuple, dict)) or loss_weights is not None
        if not several:
            if isinstance(metrics, (str, dict)) or (metrics is not None and not isinstance(metrics, (list, tuple))):
                raise TypeError(f"compile: metrics must be a list of names or Metric objects, got {metrics!r} "
                                f"(as in metrics=['accuracy'])")
            self._loss = losses_module.get(loss)
            names = [metrics_module._name_of(m) for m in (metrics or [])]
            self._compile_args = (self._optimizer, self._loss, names, self._steps_per_execution, None)
            model.compile(self._optimizer, self._loss, names)
            return
        losses = [losses_module.get(one) for one in _per_output("loss", loss, outputs, needed=True)]
        weights = None if loss_weights is None else [
            1.0 if w is None else float(w) for w in _per_output("loss_weights", loss_weights, outputs, needed=False)]
        metric_lists = _metrics_per_output(metrics, outputs)
        self._loss = losses[0] if len(losses) == 1 else losses
        self._compile_args = (self._optimizer, self._loss, metric_lists, self._steps_per_execution, weights)
        model.compile_outputs(self._optimizer, losses, metric_lists, weights or [])

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1,
            max_queue_size=10, workers=1, use_multiprocessing=False, gradient_accumulation_steps=1):
        """Trains in C++ without the GIL; Python callbacks take it for their calls. Ctrl-C
        ends training after the batch under way and raises KeyboardInterrupt."""
        del max_queue_size, workers, use_multiprocessing
        for name, value in (("class_weight", class_weight), ("sample_weight", sample_weight),
                            ("validation_steps", validation_steps), ("validation_batch_size", validation_batch_size)):
            if value is not None:
                raise NotImplementedError(f"fit({name}=...) is not supported by dtrain")
        if validation_freq != 1:
            raise NotImplementedError("fit(validation_freq=...) is not supported by dtrain: it validates every epoch")
        ship = getattr(self._strategy, "_ship_fit", None)
        if ship is not None:  # the chief of a ParameterServerStrategy: workers that run no program get this fit
            ship(self, x=x, y=y, batch_size=batch_size, shuffle=shuffle, steps_per_epoch=steps_per_epoch,
                 seed=utils._fit_seed())
        x = utils._created_dataset(x)
        _no_batch_size_for_datasets("fit", x, batch_size)
        model = self._model()
        if isinstance(validation_data, list):
            validation_data = tuple(validation_data)
        if isinstance(validation_data, tuple) and len(validation_data) == 3:
            raise NotImplementedError("fit(validation_data=(x, y, sample_weight)) is not supported by dtrain: "
                                      "give (x, y)")
        if isinstance(validation_data, tuple) and len(validation_data) == 2:
            validation_data = self._arrays("fit (validation_data)", *validation_data)
        else:
            validation_data = self._dataset_for(validation_data, "fit (validation_data)")
        x, y = self._data("fit", x, y)
        given = list(callbacks or [])
        for c in given:
            if isinstance(c, callbacks_module.Callback):
                c.model = self
        history = callbacks_module.History()
        history.model = self
        history.params = {"epochs": epochs, "steps": steps_per_epoch, "verbose": verbose}
        cpp = model.fit(x, y, 32 if batch_size is None else _whole("fit", "batch_size", batch_size),
                        _whole("fit", "epochs", epochs, int32=True), verbose, given, float(validation_split),
                        validation_data, bool(shuffle), utils._fit_seed(),
                        _whole("fit", "initial_epoch", initial_epoch, int32=True),
                        0 if steps_per_epoch is None else _whole("fit", "steps_per_epoch", steps_per_epoch),
                        _whole("fit", "gradient_accumulation_steps", gradient_accumulation_steps, int32=True),
                        self._steps_per_execution)
        history._set(cpp)
        sys.stdout.flush()
        return history

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", return_dict=False, sample_weight=None,
                 steps=None, callbacks=None, **kwargs):
        del kwargs
        for name, value in (("sample_weight", sample_weight), ("callbacks", callbacks)):
            if value is not None:
                raise NotImplementedError(f"evaluate({name}=...) is not supported by dtrain")
        _no_batch_size_for_datasets("evaluate", x, batch_size)
        if steps is not None:
            from ..data import Dataset

            if not isinstance(x, Dataset):
                raise ValueError("evaluate: steps counts a Dataset's batches; on arrays give batch_size")
            x = x.take(_whole("evaluate", "steps", steps))
        x, y = self._data("evaluate", x, y)
        model = self._model() if isinstance(x, _dtrain.data._Dataset) else self._built_model(x[0])
        batch = 32 if batch_size is None else _whole("evaluate", "batch_size", batch_size)
        logs = model.evaluate(x, y, batch, 1 if verbose == "auto" else int(verbose))
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=None, verbose="auto", steps=None, **kwargs):
        """Predictions as a numpy array; on a Dataset, of each element's inputs (its first
        component when it holds (x, y)), batch by batch as the dataset gives them."""
        del verbose, kwargs
        from ..data import Dataset

        _no_batch_size_for_datasets("predict", x, batch_size)
        if isinstance(x, Dataset):
            parts = []
            for i, element in enumerate(x):
                if steps is not None and i >= steps:
                    break
                inputs = element[0] if isinstance(element, tuple) else element
                parts.append(self._predict(inputs, None))
            if not parts:
                raise ValueError("predict: the dataset gave no batch")
            if isinstance(parts[0], list):
                return [np.concatenate([p[o] for p in parts]) for o in range(len(parts[0]))]
            return np.concatenate(parts)
        return self._predict(x, 32 if batch_size is None else _whole("predict", "batch_size", batch_size))

    def _predict(self, x, batch_size):
        """One array, or a list of one per output for a model of several."""
        inputs = self._input_list(x, "predict")
        model = self._built_model(inputs[0])
        if batch_size is None:
            batch_size = max(1, len(inputs[0]))
        if model.num_inputs == 1 and model.num_outputs == 1:
            return model.predict(inputs[0], batch_size)
        outputs = model.predict_all(inputs, batch_size)
        return outputs[0] if model.num_outputs == 1 else outputs

    def __call__(self, inputs, training=False, mask=None):
        del mask
        model = self._model()
        if model.num_inputs == 1 and model.num_outputs == 1 and not isinstance(inputs, dict):
            inputs = _model_input(inputs[0] if _one_array_list(inputs) else inputs)
            return self._built_model(inputs)(inputs, bool(training))
        outputs = model.call_all(self._input_list(inputs, "model call"), bool(training))
        return outputs[0] if len(outputs) == 1 else outputs

    # --- several inputs and outputs
    def _input_list(self, x, who):
        """x as one array or tensor per model input, in the model's order, as Keras takes it:
        one array, a list in the inputs' order, or a dict by Input name (keys that name no
        input are ignored, with a warning, as Keras ignores them)."""
        model = self._model()
        n = model.num_inputs
        names = list(model.input_names)
        if isinstance(x, dict):
            if not names:
                raise ValueError(f"{who}: model '{self.name}' takes one input, not a dict; give it the array")
            return [_model_input(v) for v in _by_name(x, names, who, "input", warn_extra=True)]
        if isinstance(x, (list, tuple)) and (n > 1 or _one_array_list(x)):
            if len(x) != n:
                raise ValueError(f"{who}: model '{self.name}' takes {n} input(s) ({', '.join(names)}), got a list "
                                 f"of {len(x)}")
            return [_model_input(v) for v in x]
        if n > 1:
            raise ValueError(f"{who}: model '{self.name}' takes {n} inputs ({', '.join(names)}); give a list in "
                             f"that order or a dict by name, not one array")
        return [_model_input(x)]

    def _target_list(self, y, who):
        """y as one target per model output, in the model's order: one array, a list in the
        outputs' order, or a dict by output name (the name of the layer making it)."""
        model = self._model()
        n = model.num_outputs
        names = list(model.output_names)
        if isinstance(y, dict):
            return _by_name(y, names, who, "output", warn_extra=False)
        if isinstance(y, (list, tuple)) and (n > 1 or _one_array_list(y)):
            if len(y) != n:
                raise ValueError(f"{who}: model '{self.name}' has {n} output(s) ({', '.join(names)}), got a list "
                                 f"of {len(y)} targets")
            return list(y)
        if n > 1:
            raise ValueError(f"{who}: model '{self.name}' has {n} outputs ({', '.join(names)}); give a target for "
                             f"each, as a list in that order or a dict by name")
        return [y]

    def _arrays(self, who, x, y):
        if y is None:
            raise ValueError(f"{who}: y (the targets) is missing; give y, or a Dataset of (x, y)")
        return self._input_list(x, who), self._target_list(y, who)

    def _data(self, who, x, y):
        """fit's and evaluate's x and y: (a C++ dataset, None) or (inputs, targets) lists."""
        dataset = self._dataset_for(x, who)
        if dataset is not x:
            if y is not None:
                raise ValueError(f"{who}: y is given inside the dataset; pass y=None with a Dataset")
            return dataset, None
        return self._arrays(who, x, y)

    def _dataset_for(self, x, who):
        """A Dataset (or distributed one) as the C++ pipeline fit reads: its elements'
        components in the model's order, its inputs then its targets. Anything else as it is."""
        from ..data import Dataset
        from ..distribute import DistributedDataset

        if isinstance(x, DistributedDataset):
            x = x._dataset
        if not isinstance(x, Dataset):
            return x
        structure = x._element_structure(resolve=True)
        order = self._component_order(structure, who)
        return x._cpp if order is None else x._cpp._select(order)

    def _component_order(self, structure, who):
        """Where each of the model's inputs and targets is among an element's components
        (None: where they are already). Elements are (inputs, targets) as Keras reads them."""
        from ..data import _ONE, _count

        model = self._model()
        if model.num_inputs == 1 and model.num_outputs == 1 and (structure is None or structure == (_ONE, _ONE)):
            return None
        if not isinstance(structure, tuple) or len(structure) != 2:
            if isinstance(structure, tuple) and len(structure) == 3:
                raise NotImplementedError(f"{who}: dataset elements of (x, y, sample_weight) are not supported by "
                                          "dtrain: give (x, y)")
            raise ValueError(f"{who}: dataset elements must be (inputs, targets) for model '{self.name}', which "
                             f"takes {model.num_inputs} input(s) and has {model.num_outputs} output(s)")
        first = 0
        positions = []
        for part, names, what in ((structure[0], list(model.input_names), "input"),
                                  (structure[1], list(model.output_names), "output")):
            count = model.num_inputs if what == "input" else model.num_outputs
            if isinstance(part, dict):
                keys = list(part)
                starts, at = {}, first
                for key in keys:
                    starts[key] = at
                    at += _count(part[key])
                index = {key: i for i, key in enumerate(keys)}
                picked = _by_name(index, names, who, what, warn_extra=what == "input")
                for key in (keys[i] for i in picked):
                    if part[key] != _ONE:
                        raise ValueError(f"{who}: the dataset's {what} '{key}' is nested; give one tensor for it")
                    positions.append(starts[key])
                first = at
            else:
                leaves = [part] if part == _ONE else list(part)
                if len(leaves) != count or any(leaf != _ONE for leaf in leaves):
                    raise ValueError(f"{who}: model '{self.name}' takes {model.num_inputs} input(s) and has "
                                     f"{model.num_outputs} output(s), but the dataset's elements hold "
                                     f"{_count(part)} {what} component(s) {_describe(part)}")
                positions += range(first, first + count)
                first += count
        return None if positions == list(range(first)) else positions


    # --- files
    def save_weights(self, filepath, overwrite=True, **kwargs):
        del overwrite, kwargs
        self._model().save_weights(str(filepath))

    def load_weights(self, filepath, **kwargs):
        del kwargs
        self._model().load_weights(str(filepath))

    def save(self, filepath, overwrite=True, **kwargs):
        del overwrite, kwargs
        self._model().save(str(filepath))


class Sequential(Model):
    """A linear stack of layers (tf.keras.Sequential)."""

    def __init__(self, layers=None, name=None, trainable=True):
        super().__init__(name=name or "sequential")
        self._input_shape = None
        if not trainable:
            raise NotImplementedError("Sequential(trainable=False) is not supported by dtrain; freeze its layers")
        for layer in layers or []:
            self.add(layer)
        if self._input_shape is not None:
            self.build((None, *self._input_shape))

    def add(self, layer):
        if self._cpp is not None:
            raise ValueError(f"Sequential '{self.name}': layers are added before the model is built")
        if isinstance(layer, layers_module.Input):
            self._input_shape = layer.shape[1:]
            return
        if isinstance(layer, layers_module.TextVectorization):
            raise TypeError("Sequential.add: TextVectorization cannot be a layer of a dtrain model (its models take "
                            "numbers): apply it to the text before the model, or map it over the dataset, "
                            "ds.map(lambda x, y: (vectorize(x), y))")
        if not isinstance(layer, layers_module.Layer):
            raise TypeError(f"Sequential.add: expected a tf.keras.layers layer, got {type(layer).__name__}")
        if isinstance(layer, layers_module.InputLayer):
            self._input_shape = layer._input_shape
            return
        if layer._built is not None:
            raise ValueError(f"layer '{layer.name}' belongs to a model already")
        if not self._layers and layer._input_shape is not None:
            self._input_shape = layer._input_shape
        self._layers.append(layer)

    def _make_cpp(self):
        # Layers of your own have no Keras JSON: the stack is made of the layers themselves.
        if any(layers_module._is_own(layer) for layer in self._layers):
            return _k._sequential(self._name, [layer._standalone() for layer in self._layers])
        return super()._make_cpp()

    def _keras_json(self):
        config = {"name": self._name, "layers": [layer._keras_json() for layer in self._layers]}
        if self._input_shape is not None:
            config["build_input_shape"] = [None, *self._input_shape]
        return {"class_name": "Sequential", "config": config}


Input = layers_module.Input


class _Graph:
    """A functional model's layers and calls, from its outputs back to its inputs, as
    tf.keras's Functional JSON."""

    def __init__(self, inputs, outputs):
        self.inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        self.outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        for t in self.inputs + self.outputs:
            if not isinstance(t, layers_module.KerasTensor):
                raise TypeError("Model(inputs, outputs): inputs and outputs are tensors from tf.keras.Input and layer calls")
        for t in self.inputs:
            if not isinstance(t, layers_module.Input):
                raise TypeError(f"Model(inputs, ...): {t!r} is not a tf.keras.Input")
        self.entries = []  # Inputs and layers, each once, every one after what it reads
        seen = set()

        def visit(owner):
            if id(owner) in seen:
                return
            seen.add(id(owner))
            for refs in getattr(owner, "_nodes", []):
                for ref in refs:
                    visit(ref._keras_layer)
            for mask in getattr(owner, "_attention_masks", {}).values():
                visit(mask._keras_layer)
            self.entries.append(owner)

        for t in self.outputs:
            visit(t._keras_layer)
        missing = [e for e in self.entries if isinstance(e, layers_module.Input) and e not in self.inputs]
        if missing:
            raise ValueError(f"Model(inputs, outputs): the outputs read {missing[0]!r}, which is not among the inputs")
        self.layers = [e for e in self.entries if not isinstance(e, layers_module.Input)]

    def keras_json(self, name):
        return {"class_name": "Functional", "config": {
            "name": name,
            "layers": [e._graph_json() for e in self.inputs + [e for e in self.entries if e not in self.inputs]],
            "input_layers": [[t.layer_name, 0, 0] for t in self.inputs],
            "output_layers": [[t.layer_name, t.node_index, 0] for t in self.outputs]}}


def _model_input(x):
    """A model's input as Keras casts it: integers and booleans (a list of ints, an int64
    array) to float32, which the first layer computes in; uint8 images stay bytes, which
    Rescaling takes as they are."""
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (np.ndarray, _dtrain.Tensor)):
        x = np.asarray(x)
    if isinstance(x, np.ndarray) and x.dtype.kind in "iub" and x.dtype != np.uint8:
        return x.astype(np.float32)
    return x


def _one_array_list(x):
    """A list holding one array or tensor: Keras's way of giving a one-input model's input."""
    return isinstance(x, (list, tuple)) and len(x) == 1 and isinstance(x[0], (np.ndarray, _dtrain.Tensor))


def _by_name(values, names, who, what, warn_extra):
    """A dict's values in the order of `names` (the model's inputs or outputs)."""
    missing = [n for n in names if n not in values]
    if missing:
        raise ValueError(f"{who}: the dict has no {what} '{missing[0]}' (the model's {what}s: {', '.join(names)}; "
                         f"the dict's keys: {', '.join(map(str, values))})")
    extra = [k for k in values if k not in names]
    if extra and not warn_extra:
        raise ValueError(f"{who}: the dict's key '{extra[0]}' names no {what} of the model ({', '.join(names)})")
    if extra:
        import warnings

        warnings.warn(f"{who}: the dict's keys {extra} name no input of the model ({', '.join(names)}); they are "
                      "ignored", stacklevel=3)
    return [values[n] for n in names]


def _describe(structure):
    from ..data import _ONE

    if structure == _ONE:
        return "(one tensor)"
    if isinstance(structure, dict):
        return "(a dict: " + ", ".join(map(str, structure)) + ")"
    return f"(a tuple of {len(structure)})"


def _per_output(what, value, outputs, needed):
    """compile's loss or loss_weights as a list: one for all outputs, or one for each."""
    if isinstance(value, dict):
        unknown = [k for k in value if k not in outputs]
        if unknown:
            raise ValueError(f"compile({what}=...): '{unknown[0]}' names no output of the model "
                             f"({', '.join(outputs)})")
        missing = [o for o in outputs if o not in value]
        if missing and needed:
            raise ValueError(f"compile({what}=...): output '{missing[0]}' has no loss; dtrain trains every output "
                             f"(the model's outputs: {', '.join(outputs)})")
        return [value.get(o) for o in outputs]
    if isinstance(value, (list, tuple)):
        if len(value) != len(outputs):
            raise ValueError(f"compile({what}=...): {len(value)} given for the model's {len(outputs)} output(s) "
                             f"({', '.join(outputs)})")
        return list(value)
    return [value]


def _metrics_per_output(metrics, outputs):
    """compile's metrics as one list of names for each output (or one list for all)."""
    if metrics is None:
        return []
    if isinstance(metrics, dict):
        lists = _per_output("metrics", metrics, outputs, needed=False)
        return [[metrics_module._name_of(m) for m in
                 ([] if ms is None else ms if isinstance(ms, (list, tuple)) else [ms])] for ms in lists]
    if isinstance(metrics, str) or not isinstance(metrics, (list, tuple)):
        raise TypeError(f"compile: metrics must be a list, a list of lists or a dict by output name, got {metrics!r}")
    if metrics and all(isinstance(m, (list, tuple)) for m in metrics):
        if len(metrics) not in (1, len(outputs)):
            raise ValueError(f"compile(metrics=...): {len(metrics)} lists for the model's {len(outputs)} output(s) "
                             f"({', '.join(outputs)})")
        return [[metrics_module._name_of(m) for m in ms] for ms in metrics]
    return [[metrics_module._name_of(m) for m in metrics]]


def _no_batch_size_for_datasets(fn, x, batch_size):
    """A Dataset gives its own batches: a batch_size beside it would be silently ignored."""
    if batch_size is not None and _unwrap_dataset(x) is not x:
        raise ValueError(f"{fn}: batch_size is for arrays; a Dataset's batches are its own "
                         f"(batch it with dataset.batch({batch_size}) instead)")


def _unwrap_dataset(x):
    from ..data import Dataset
    from ..distribute import DistributedDataset

    if isinstance(x, DistributedDataset):
        return x._dataset._cpp
    if isinstance(x, Dataset):
        return x._cpp
    return x


def load_model(filepath, compile=True, **kwargs):  # noqa: A002 (Keras's argument name)
    """A model that Model.save wrote, or a .keras archive Keras wrote (its config.json, its
    model.weights.h5 and, with compile, its compile_config), made under the strategy whose
    scope is open. Model.save writes dtrain's own file (safetensors), whatever its name."""
    del kwargs
    import zipfile

    path = str(filepath)
    # Keras's .keras is a zip archive; Model.save writes dtrain's own file whatever the name.
    if path.endswith(".keras") and zipfile.is_zipfile(path):
        return _load_keras_archive(path, compile)
    return Model._wrap(_k._load_model(path, bool(compile)))


def model_from_json(json_string, custom_objects=None):
    """A model from the JSON Keras's to_json() writes (tf.keras 2.x and Keras 3)."""
    if custom_objects:
        raise NotImplementedError("model_from_json(custom_objects=...): dtrain reads the layers it has")
    return Model._wrap(_model_from_text(json_string))


def _model_from_text(text):
    """The dtrain model of a Keras JSON text, made under the strategy whose scope is open."""
    scope = _d._Scope(_d._current_backend())
    scope.enter()
    try:
        return _k._Model.from_json(text if isinstance(text, str) else json.dumps(text))
    finally:
        scope.exit()


def _keras_weights(h5, model, path):
    """Each layer's arrays from a .keras archive's model.weights.h5 (Keras 3 keeps them at
    layers/<layer name>/vars/<index>, trainable ones first, in the layer's own order)."""
    arrays = []
    for layer in model.layers:
        n = len(layer.variables)
        if n == 0:
            continue
        group = None
        for base in ("layers", "_layers"):
            candidate = f"{base}/{layer.name}/vars"
            if candidate in h5:
                group = h5[candidate]
                break
        if group is None:
            raise ValueError(f"{path}: model.weights.h5 has no layers/{layer.name}/vars for layer '{layer.name}'")
        if len(group) != n:
            raise ValueError(f"{path}: model.weights.h5 holds {len(group)} arrays for layer '{layer.name}', "
                             f"which has {n} weights")
        for i in range(n):
            arrays.append(np.asarray(group[str(i)]))
    return arrays


def _load_keras_archive(path, compile):  # noqa: A002
    import zipfile

    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise OSError(f"{path}: not a .keras archive ({e})") from None
    with archive:
        names = set(archive.namelist())
        if "config.json" not in names:
            raise OSError(f"{path}: a .keras archive holds config.json; this one has {sorted(names)}")
        config = json.loads(archive.read("config.json"))
        compile_config = config.get("compile_config") if isinstance(config, dict) else None
        model = Model._wrap(_model_from_text(json.dumps(config)))
        if "model.weights.h5" in names:
            try:
                import h5py
            except ImportError:
                raise ImportError(f"{path}: reading its weights needs h5py (Debian's python3-h5py)") from None
            import io

            with h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as h5:
                model.set_weights(_keras_weights(h5, model, path))
    if compile and compile_config:
        loss = compile_config.get("loss")
        if isinstance(loss, dict):
            loss = loss.get("config", {}).get("name") or loss.get("class_name")
        metrics = [m if isinstance(m, str) else (m.get("config", {}).get("name") or m.get("class_name"))
                   for m in (compile_config.get("metrics") or [])]
        model.compile(optimizer=optimizers_module.get(compile_config.get("optimizer") or "rmsprop"),
                      loss=loss, metrics=metrics or None)
    return model

