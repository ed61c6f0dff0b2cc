"""Tensors, dtypes, the ops a custom loop writes, GradientTape and tf.function."""
import builtins
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
float16 = DType("float16", np.float16)  # held as float32 outside mixed_float16's matmuls, as float64 is
half = float16
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)  # held as int32 by dtrain, as labels are
uint8 = DType("uint8", np.uint8)
bool_ = DType("bool", np.bool_)
float64 = DType("float64", np.float64)  # computed in float32
string = DType("string", np.object_)  # byte strings of any length; .numpy() gives bytes objects


def _raw_dtype_name(dtype):
    """'float32', 'int64', 'bool', ... as a DType, a numpy dtype or a string names it."""
    if isinstance(dtype, DType):
        return dtype.name
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def _dtype_name(dtype):
    """The dtype dtrain holds for a DType, a numpy dtype or a string ('float32', 'int32',
    ...; int64 and bool as int32); '' for None."""
    if dtype is None:
        return ""
    name = _raw_dtype_name(dtype)
    return {"float64": "float32", "float16": "float32", "int64": "int32", "int16": "int32", "int8": "int32",
            "bool": "int32", "object": "string", "str": "string", "bytes": "string"}.get(name, name)


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


def add_n(inputs, name=None):
    """The element-wise sum of a list of tensors of one shape."""
    del name
    return _ops.add_n(list(inputs))


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


# --- ops without a gradient (TensorFlow records none for them either): computed on the
# values, their results recorded by no tape. dtrain holds booleans as int32 0 and 1.

def _values(x, fn):
    """x's values as a numpy array: a tensor's, a variable's, an array's or a number's."""
    if isinstance(x, (_dtrain.Tensor, _dtrain.Variable)):
        return x.numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: expected a tensor, an array or a number, got {type(x).__name__}") from None


def _int_tensor(array):
    return _dtrain.Tensor(np.ascontiguousarray(array, dtype=np.int32), "int32")


def _broadcast(fn, a, b):
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise _dtrain.errors.InvalidArgumentError(
            f"{fn}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None


def _comparison(fn, op):
    def compare(x, y, name=None):
        del name
        a, b = _values(x, fn), _values(y, fn)
        _broadcast(fn, a, b)
        return _int_tensor(op(a, b))

    compare.__name__ = fn
    compare.__doc__ = f"tf.math.{fn}: element-wise, with broadcasting; 1 where it holds, 0 where not (int32)."
    return compare


equal = _comparison("equal", np.equal)
not_equal = _comparison("not_equal", np.not_equal)
less = _comparison("less", np.less)
less_equal = _comparison("less_equal", np.less_equal)
greater = _comparison("greater", np.greater)
greater_equal = _comparison("greater_equal", np.greater_equal)


def _axis(fn, axis, rank):
    axis = _whole(fn, "axis", axis)
    if not -rank <= axis < rank:
        raise _dtrain.errors.InvalidArgumentError(f"{fn}: axis {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def _arg(fn, pick):
    def arg(input, axis=None, output_type=int64, name=None):  # noqa: A002 (TensorFlow's argument name)
        del name
        if _dtype_name(output_type) != "int32":
            raise TypeError(f"{fn}: output_type must be tf.int64 or tf.int32, got {output_type!r}")
        a = _values(input, fn)
        if a.ndim == 0:
            raise _dtrain.errors.InvalidArgumentError(f"{fn}: a scalar has no axis to search")
        axis = _axis(fn, 0 if axis is None else axis, a.ndim)
        if a.shape[axis] == 0:
            raise _dtrain.errors.InvalidArgumentError(f"{fn}: axis {axis} of shape {list(a.shape)} is empty")
        return _int_tensor(pick(a, axis=axis))

    arg.__name__ = fn
    arg.__doc__ = f"tf.math.{fn}: the index along ``axis`` (default 0), the first where several tie (int32)."
    return arg


argmax = _arg("argmax", np.argmax)
argmin = _arg("argmin", np.argmin)


def _truth(fn, op):
    def reduce(input_tensor, axis=None, keepdims=False, name=None):
        del name
        a = _values(input_tensor, fn) != 0
        if axis is not None:
            if isinstance(axis, (_dtrain.Tensor, np.ndarray)):
                axis = _values(axis, fn).ravel().tolist()
            axes = [axis] if not isinstance(axis, (list, tuple)) else list(axis)
            axis = tuple(_axis(fn, x, a.ndim) for x in axes)
            if len(set(axis)) != len(axis):
                raise _dtrain.errors.InvalidArgumentError(f"{fn}: axis {list(axes)} names an axis twice")
        return _int_tensor(op(a, axis=axis, keepdims=bool(keepdims)))

    reduce.__name__ = fn
    reduce.__doc__ = f"tf.math.{fn}: over ``axis`` (every axis by default); 1 or 0 (int32)."
    return reduce


reduce_all = _truth("reduce_all", np.all)
reduce_any = _truth("reduce_any", np.any)


def cast(x, dtype, name=None):
    """tf.cast: to the same dtype, ``x`` itself; to an integer dtype, truncated toward
    zero as TensorFlow does (a value outside int32, or not finite, is named; integers
    cast to uint8 wrap, as TensorFlow's do); to bool, 1 where not zero. Recorded by no
    tape: a gradient stops at a cast to another dtype (TensorFlow's also stops at
    integers, but flows between float32 and bfloat16)."""
    del name
    want = _dtype_name(dtype)
    if _raw_dtype_name(dtype) == "bool":
        return _int_tensor(_values(x, "cast") != 0)
    if isinstance(x, (_dtrain.Tensor, _dtrain.Variable)) and x.dtype == want:
        return x if isinstance(x, _dtrain.Tensor) else x.value()
    a = _values(x, "cast")
    checked = want == "int32" or (want == "uint8" and a.dtype.kind in "fc")
    if checked and a.dtype.kind in "iufc":
        a = np.trunc(np.real(a)) if a.dtype.kind in "fc" else a
        info = np.iinfo(want)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(a) | (a < info.min) | (a > info.max)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise _dtrain.errors.InvalidArgumentError(
                f"cast: value {a[where].item()} at {list(where)} does not fit in {want}")
    return convert_to_tensor(a.astype(np.float32 if want == "bfloat16" else want), want)


def _dims(x):
    return x.shape if isinstance(x, (_dtrain.Tensor, _dtrain.Variable)) else np.shape(x)


def shape(input, out_type=int32, name=None):  # noqa: A002 (TensorFlow's argument name)
    """tf.shape: the dimensions as an int32 tensor."""
    del name, out_type
    return _int_tensor(np.array(_dims(input), dtype=np.int64))


def size(input, out_type=int32, name=None):  # noqa: A002
    """tf.size: the number of elements, an int32 scalar."""
    del name, out_type
    return _int_tensor(np.array(int(np.prod(_dims(input), dtype=np.int64))))


def rank(input, name=None):  # noqa: A002
    """tf.rank: the number of dimensions, an int32 scalar."""
    del name
    return _int_tensor(np.array(len(_dims(input))))


def range(start, limit=None, delta=1, dtype=None, name="range"):  # noqa: A001 (TensorFlow's name)
    """tf.range: int32 where start, limit and delta are whole numbers, float32 where not;
    with a ``dtype``, each of them cast to it first, as TensorFlow does."""
    del name
    if limit is None:
        start, limit = 0, start
    values = []
    for what, v in (("start", start), ("limit", limit), ("delta", delta)):
        value = _values(v, "range")
        if value.size != 1 or isinstance(v, bool) or value.dtype.kind not in "iuf":
            raise TypeError(f"range: {what} must be a number, got {v!r}")
        values.append(value.reshape(()).item())
    whole = all(isinstance(v, int) for v in values)
    want = _dtype_name(dtype) or ("int32" if whole else "float32")
    if want not in ("int32", "float32"):
        raise TypeError(f"range: dtype must be an integer or float type, got {dtype!r}")
    if not all(np.isfinite(v) for v in values):
        raise _dtrain.errors.InvalidArgumentError(f"range: start, limit and delta must be finite, got {values}")
    if want == "int32":
        values = [int(v) for v in values]  # truncated toward zero, as a cast is
        if not all(-2**31 <= v < 2**31 for v in values):
            raise _dtrain.errors.InvalidArgumentError(f"range: {values} do not fit in int32")
    begin, end, step = values
    if step == 0:
        raise _dtrain.errors.InvalidArgumentError("range: delta must not be 0")
    if (step > 0 and begin > end) or (step < 0 and begin < end):
        raise _dtrain.errors.InvalidArgumentError(
            f"range: start {begin} does not reach limit {end} by delta {step}")
    a = np.arange(begin, end, step, dtype=np.float64 if want == "float32" else np.int64)
    return _int_tensor(a) if want == "int32" else _dtrain.Tensor(a.astype(np.float32), "float32")


def _array_like(x):
    return isinstance(x, (_dtrain.Tensor, _dtrain.Variable, np.ndarray, np.generic, int, float, list, tuple))


def _by_value(op, apart):
    """TensorFlow's == (``apart`` False) or != (True): element-wise; against None, or
    where the shapes do not broadcast, ``apart`` (a scalar). Against anything else
    (pytest.approx, a string), the other side's operator."""
    def compare(a, b):
        if b is None:
            return apart
        if not _array_like(b):
            return NotImplemented
        try:
            return op(a, b)
        except (TypeError, ValueError):
            return _int_tensor(np.array(int(apart)))

    return compare


_tensor_equals = _by_value(equal, False)
_tensor_differs = _by_value(not_equal, True)


def _unhashable(self):
    raise TypeError(f"{type(self).__name__} is unhashable (== compares its values): use .ref() as the key")


class _Reference:
    """A tensor's or variable's identity as a hashable key (TensorFlow's ``x.ref()``)."""

    def __init__(self, target):
        self._target = target

    def deref(self):
        return self._target

    def __eq__(self, other):
        return isinstance(other, _Reference) and other._target is self._target

    def __hash__(self):
        return id(self._target)


def _power(x, exponent):
    """x ** exponent, recorded by live tapes: a whole exponent as products (and a quotient
    where it is negative), 0.5 as sqrt, another as exp(exponent * log(x)), which is not
    finite where x < 0 (TensorFlow's pow gives NaN there)."""
    if not _array_like(exponent) or isinstance(exponent, bool):
        return NotImplemented
    number = isinstance(exponent, (int, float, np.integer, np.floating))
    if number and exponent == 0.5:
        return _ops.sqrt(x)
    if number and float(exponent).is_integer() and -64 <= exponent <= 64:
        n = int(exponent) if exponent > 0 else -int(exponent)
        result, base = None, x
        while n:  # square and multiply: ~2 log2(n) products
            if n & 1:
                result = base if result is None else _ops.multiply(result, base)
            n >>= 1
            if n:
                base = _ops.square(base)
        if result is None:
            return _ops.ones_like(x)
        return _ops.divide(1.0, result) if exponent < 0 else result
    return _ops.exp(_ops.multiply(_ops.log(x), exponent))


def _power_of(x, base):
    """base ** x for a number or array base: exp(x * log(base))."""
    if not _array_like(base):
        return NotImplemented
    return _ops.exp(_ops.multiply(x, convert_to_tensor(np.log(np.asarray(base, np.float32)))))


for _cls in (_dtrain.Tensor, _dtrain.Variable):
    # numpy on the left (rows @ kernel, array == tensor) defers to these operators, which
    # tapes record, instead of reading the values through __array__, as TensorFlow's.
    _cls.__array_priority__ = 100
    _cls.__pow__ = _power
    _cls.__rpow__ = _power_of
    _cls.__eq__ = _tensor_equals
    _cls.__ne__ = _tensor_differs
    for _name, _op in (("__lt__", less), ("__le__", less_equal), ("__gt__", greater), ("__ge__", greater_equal)):
        setattr(_cls, _name, lambda a, b, op=_op: op(a, b) if _array_like(b) else NotImplemented)
    _cls.__hash__ = _unhashable
    _cls.ref = lambda self: _Reference(self)
del _cls, _name, _op


class device:  # noqa: N801 (TensorFlow's name)
    """``with tf.device('/GPU:0'):``: weights, variables and constants made inside live on that
    device ('/CPU:0', '/GPU:1', 'cuda', ...), and fit trains there. Without it they live on
    the first GPU where one is present, else on the CPU, as in TensorFlow. A GPU that is not
    here is an InvalidArgumentError naming what was found."""

    def __init__(self, device_name):
        self._name = device_name
        self._saved = []

    def __enter__(self):
        self._saved.append(_dtrain._exchange_placement(self._name))
        return self

    def __exit__(self, *exc):
        _dtrain._exchange_placement(self._saved.pop())
        return False


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


# --- selection, joining and clipping, each with its gradient (autograd/op_select.cpp and
# compositions of recorded ops).

def reduce_max(input_tensor, axis=None, keepdims=False, name=None):
    """The largest value over axis; the gradient goes to the maximal elements, shared among ties."""
    del name
    return _ops.reduce_max(input_tensor, axis, keepdims)


def reduce_min(input_tensor, axis=None, keepdims=False, name=None):
    del name
    return _ops.reduce_min(input_tensor, axis, keepdims)


def reduce_prod(input_tensor, axis=None, keepdims=False, name=None):
    """The product over axis (1 for an empty one); each element's gradient is the product
    of the others, zeros included."""
    del name
    return _ops.reduce_prod(input_tensor, axis, keepdims)


def reduce_variance(input_tensor, axis=None, keepdims=False, name=None):
    """The population variance over axis (the mean of the squared deviations)."""
    del name
    deviations = subtract(input_tensor, _ops.reduce_mean(input_tensor, axis, True))
    return _ops.reduce_mean(square(deviations), axis, keepdims)


def reduce_std(input_tensor, axis=None, keepdims=False, name=None):
    """The population standard deviation over axis."""
    del name
    return sqrt(reduce_variance(input_tensor, axis, keepdims))


def reduce_euclidean_norm(input_tensor, axis=None, keepdims=False, name=None):
    del name
    return sqrt(_ops.reduce_sum(square(input_tensor), axis, keepdims))


def reduce_logsumexp(input_tensor, axis=None, keepdims=False, name=None):
    """log(sum(exp(x))) over axis, computed from each group's largest value (a constant, as
    TensorFlow's: the gradient is the softmax of the group), so that large values do not
    overflow; a group whose largest value is infinite is shifted by 0."""
    del name
    if 0 in tuple(_dims(input_tensor)):
        raise ValueError("reduce_logsumexp: of an empty tensor")
    largest = _values(_ops.reduce_max(input_tensor, axis, True), "reduce_logsumexp").copy()
    largest[~np.isfinite(largest)] = 0.0
    shift = constant(largest)
    summed = log(_ops.reduce_sum(exp(subtract(input_tensor, shift)), axis, True))
    out = add(summed, shift)
    return out if keepdims else _ops.reduce_sum(out, axis, False)


def where(condition, x=None, y=None, name=None):
    """tf.where: x where condition is true, else y (shapes as condition's, or scalars), each
    getting the gradient where it was chosen; with condition alone, the coordinates of its
    true elements (int32 [n, rank], no gradient)."""
    del name
    if x is None and y is None:
        return _int_tensor(np.argwhere(_values(condition, "where")))
    if x is None or y is None:
        raise ValueError("where: give both x and y, or neither")
    return _ops.where(condition, x, y)


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """tf.gather: params' slices at indices along axis (batch_dims by default); the first
    batch_dims dimensions are shared, each batch of indices reading its own batch of params.
    The gradient adds into the slices gathered."""
    del validate_indices, name
    indices = convert_to_tensor(indices, int32)
    return _ops.gather(params, indices, int(batch_dims) if axis is None else int(axis), int(batch_dims))


def concat(values, axis, name=None):
    """The tensors joined along axis (negative from the end)."""
    del name
    return _ops.concat(list(values), int(axis))


def stack(values, axis=0, name=None):
    """The tensors (of one shape) stacked along a new axis."""
    del name
    values = [v if isinstance(v, (_dtrain.Tensor, _dtrain.Variable)) else convert_to_tensor(v) for v in values]
    if not values:
        raise ValueError("stack: needs at least one tensor")
    shape = list(values[0].shape)
    a = axis + len(shape) + 1 if axis < 0 else axis
    if not 0 <= a <= len(shape):
        raise ValueError(f"stack: axis {axis} is outside tensors of rank {len(shape)} (+1)")
    expanded = [_ops.reshape(v, tuple(shape[:a] + [1] + shape[a:])) for v in values]
    return _ops.concat(expanded, a)


def unstack(value, num=None, axis=0, name=None):
    del name
    shape = list(value.shape)
    a = axis + len(shape) if axis < 0 else axis
    count = shape[a] if num is None else int(num)
    rest = tuple(shape[:a] + shape[a + 1:])
    return [_ops.reshape(_ops.slice_axis(value, a, i, 1), rest) for i in builtins.range(count)]


def split(value, num_or_size_splits, axis=0, num=None, name=None):
    """tf.split: num_or_size_splits equal pieces, or pieces of the sizes given (one may be
    -1: the rest), along axis."""
    del num, name
    shape = list(value.shape)
    a = int(axis) + len(shape) if int(axis) < 0 else int(axis)
    dim = shape[a]
    if isinstance(num_or_size_splits, int):
        if num_or_size_splits <= 0 or dim % num_or_size_splits:
            raise _dtrain.errors.InvalidArgumentError(
                f"split: axis {a} of size {dim} does not split into {num_or_size_splits} equal pieces")
        sizes = [dim // num_or_size_splits] * num_or_size_splits
    else:
        sizes = [int(s) for s in (num_or_size_splits.numpy() if hasattr(num_or_size_splits, "numpy")
                                  else num_or_size_splits)]
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = dim - (sum(sizes) + 1)
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise _dtrain.errors.InvalidArgumentError(f"split: sizes {sizes} do not add up to axis {a}'s {dim}")
    pieces, begin = [], 0
    for size in sizes:
        pieces.append(_ops.slice_axis(value, a, begin, size))
        begin += size
    return pieces


def clip_by_norm(t, clip_norm, axes=None, name=None):
    """t * clip_norm / max(l2norm(t, axes), clip_norm): t scaled down to an L2 norm of at
    most clip_norm (along axes, or over all of it), with the gradient through the norm."""
    del name
    summed = _ops.reduce_sum(_ops.square(t), None if axes is None else axes, axes is not None)
    nonzero = _int_tensor(_values(summed, "clip_by_norm") > 0)  # sqrt's gradient is kept off the zeros
    norm = _ops.where(nonzero, _ops.sqrt(_ops.where(nonzero, summed, 1.0)), 0.0)
    clip = float(clip_norm)
    bigger = _int_tensor(_values(norm, "clip_by_norm") > clip)
    return _ops.divide(_ops.multiply(t, clip), _ops.where(bigger, norm, clip))


def global_norm(t_list, name=None):
    """sqrt(sum of every tensor's squared values); None entries are skipped."""
    del name
    squares = [_ops.reduce_sum(_ops.square(t), None, False) for t in t_list if t is not None]
    if not squares:
        return convert_to_tensor(np.float32(0.0))
    return _ops.sqrt(_ops.add_n(squares))


def clip_by_global_norm(t_list, clip_norm, use_norm=None, name=None):
    """tf.clip_by_global_norm: every tensor scaled by clip_norm / max(global_norm, clip_norm);
    returns (the clipped list, None entries kept, and the global norm). A global norm that is
    not finite makes every value NaN, as in TensorFlow."""
    del name
    t_list = list(t_list)
    norm = global_norm(t_list) if use_norm is None else convert_to_tensor(use_norm)
    clip = float(clip_norm)
    value = float(_values(norm, "clip_by_global_norm"))
    if not np.isfinite(value):
        scale = convert_to_tensor(np.float32(np.nan))
    else:
        scale = _ops.divide(clip, _ops.where(_int_tensor(np.asarray(value > clip)), norm, clip))
    return [None if t is None else _ops.multiply(t, scale) for t in t_list], norm
