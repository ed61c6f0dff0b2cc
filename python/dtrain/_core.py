"""Tensors, dtypes, the ops a custom loop writes, GradientTape and tf.function."""
import functools
import operator

import numpy as np

from . import _dtrain

_ops = _dtrain.ops


class DType:
    """A dtype as TensorFlow names it (tf.float32, tf.int32, ...)."""

    def __init__(self, name, numpy_dtype):
        self.name = name
        self.as_numpy_dtype = numpy_dtype

    def __repr__(self):
        return "tf." + self.name

    def __eq__(self, other):
        return self.name == _dtype_name(other)

    def __hash__(self):
        return hash(self.name)


float32 = DType("float32", np.float32)
bfloat16 = DType("bfloat16", np.float32)
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)  # held as int32 by dtrain, as labels are
uint8 = DType("uint8", np.uint8)
bool_ = DType("bool", np.bool_)
float64 = DType("float64", np.float64)  # computed in float32


def _dtype_name(dtype):
    """'float32', 'int32', ... for a DType, a numpy dtype or a string; '' for None."""
    if dtype is None:
        return ""
    if isinstance(dtype, DType):
        name = dtype.name
    elif isinstance(dtype, str):
        name = dtype
    else:
        name = np.dtype(dtype).name
    return {"float64": "float32", "float16": "float32", "int64": "int32", "int16": "int32", "int8": "int32",
            "bool": "int32"}.get(name, name)


def _whole(fn, name, value, int32=False):
    """A count given to ``fn``: an int (numpy's too, or an integer tensor of one value), as
    range() takes it; 2.9 epochs is a TypeError, as in Keras, not 2. With ``int32``, one
    the C++ side holds in 32 bits."""
    if isinstance(value, _dtrain.Tensor) and value.dtype == "int32":
        array = value.numpy()
        value = int(array.reshape(())) if array.size == 1 else value
    if isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be a whole number, got {value!r}")
    try:
        whole = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be a whole number, got {value!r}") from None
    if int32 and not -2**31 <= whole < 2**31:
        raise ValueError(f"{fn}: {name} must fit in 32 bits, got {whole}")
    return whole


def convert_to_tensor(value, dtype=None, name=None):
    """A dtrain Tensor from a Tensor, a Variable, an array or a number. An array that is
    already C-contiguous and of the tensor's dtype is shared, not copied."""
    del name
    return _dtrain.convert_to_tensor(value, _dtype_name(dtype))


def constant(value, dtype=None, shape=None, name=None):
    del name
    array = np.asarray(value, dtype=None if dtype is None else np.dtype(_numpy_of(dtype)))
    if shape is not None:
        shape = tuple(shape)
        array = array.reshape(shape) if array.size == int(np.prod(shape)) else np.broadcast_to(array, shape).copy()
    return _dtrain.Tensor(array, _dtype_name(dtype))


def _numpy_of(dtype):
    return dtype.as_numpy_dtype if isinstance(dtype, DType) else dtype


def zeros(shape, dtype=float32, name=None):
    del name
    return _ops.zeros(tuple(shape) if not isinstance(shape, int) else (shape,), _dtype_name(dtype))


def ones(shape, dtype=float32, name=None):
    del name
    t = _ops.fill(tuple(shape) if not isinstance(shape, int) else (shape,), 1.0)
    return t if _dtype_name(dtype) == "float32" else convert_to_tensor(t.numpy(), dtype)


def fill(dims, value, name=None):
    del name
    return _ops.fill(tuple(dims), float(value))


def zeros_like(input, dtype=None, name=None):  # noqa: A002 (TensorFlow's argument name)
    del name
    t = _ops.zeros_like(input)
    return t if dtype is None else convert_to_tensor(t.numpy(), dtype)


def ones_like(input, dtype=None, name=None):  # noqa: A002
    del name
    t = _ops.ones_like(input)
    return t if dtype is None else convert_to_tensor(t.numpy(), dtype)


def reduce_sum(input_tensor, axis=None, keepdims=False, name=None):
    del name
    return _ops.reduce_sum(input_tensor, axis, keepdims)


def reduce_mean(input_tensor, axis=None, keepdims=False, name=None):
    del name
    return _ops.reduce_mean(input_tensor, axis, keepdims)


def matmul(a, b, transpose_a=False, transpose_b=False, name=None):
    del name
    return _ops.matmul(a, b, transpose_a, transpose_b)


add = _ops.add
subtract = _ops.subtract
multiply = _ops.multiply
divide = _ops.divide
square = _ops.square
sqrt = _ops.sqrt
exp = _ops.exp
log = _ops.log
abs = _ops.abs  # noqa: A001 (TensorFlow's name)
stop_gradient = _ops.stop_gradient


def reshape(tensor, shape, name=None):
    del name
    return _ops.reshape(tensor, tuple(shape))


def one_hot(indices, depth, dtype=None, name=None):
    del name, dtype
    return _ops.one_hot(convert_to_tensor(indices, int32), depth)


def clip_by_value(t, clip_value_min, clip_value_max, name=None):
    del name
    return _ops.clip_by_value(t, float(clip_value_min), float(clip_value_max))


class TensorSpec:
    """The shape and dtype of one component (tf.data.Dataset.from_generator's signature)."""

    def __init__(self, shape=None, dtype=float32, name=None):
        self.shape = None if shape is None else tuple(shape)
        self.dtype = dtype
        self.name = name

    def __repr__(self):
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype!r})"


class GradientTape:
    """Records the ops on watched tensors inside its ``with`` block; ``gradient`` answers
    after the block too. Trainable variables read inside the block are watched.

    Tapes belong to the thread that enters them: inside ``strategy.run`` each replica's
    thread makes its own."""

    def __init__(self, persistent=False, watch_accessed_variables=True):
        if not watch_accessed_variables:
            raise NotImplementedError("GradientTape(watch_accessed_variables=False) is not supported by dtrain")
        self._tape = _dtrain._GradientTape(persistent)

    def __enter__(self):
        self._tape.enter()
        return self

    def __exit__(self, *exc):
        self._tape.exit()
        return False

    def watch(self, tensor):
        self._tape.watch(tensor)

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=None):
        del unconnected_gradients
        if isinstance(sources, (_dtrain.Variable, _dtrain.Tensor)):
            return self._tape.gradient(target, [sources], output_gradients)[0]
        if isinstance(sources, dict):
            keys = list(sources)
            grads = self._tape.gradient(target, [sources[k] for k in keys], output_gradients)
            return dict(zip(keys, grads))
        return self._tape.gradient(target, list(sources), output_gradients)


def function(func=None, input_signature=None, autograph=True, jit_compile=None, reduce_retracing=False, **kwargs):
    """tf.function: dtrain runs Python eagerly and its kernels in C++, so the decorated
    function is the function itself (``@tf.function`` and ``@tf.function(...)`` both work)."""
    del input_signature, autograph, jit_compile, reduce_retracing, kwargs

    def wrap(f):
        @functools.wraps(f)
        def call(*args, **kw):
            return f(*args, **kw)

        call.python_function = f
        return call

    return wrap if func is None else wrap(func)
