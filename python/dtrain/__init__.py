"""dtrain: train neural networks on one core, many cores, many processes and many machines.

The package speaks TensorFlow's names, so that a TensorFlow program runs on dtrain with its
import line changed (``import dtrain as tf``). Python only describes the job: fit, the input
pipeline and every strategy run in dtrain's C++ engine, without the GIL.
"""
from . import _dtrain
from ._dtrain import Tensor, Variable, errors
from ._core import (
    DType, float32, bfloat16, float16, half, int32, int64, uint8, bool_ as bool, float64, string,
    constant, convert_to_tensor, zeros, ones, fill, zeros_like, ones_like, function,
    reduce_sum, reduce_mean, matmul, add, add_n, subtract, multiply, divide, square, sqrt, exp, log, abs,
    reshape, one_hot, clip_by_value, stop_gradient, TensorSpec, GradientTape,
    equal, not_equal, less, less_equal, greater, greater_equal, argmax, argmin, reduce_all, reduce_any, cast,
    shape, size, rank, range, device,
    reduce_max, reduce_min, reduce_prod, reduce_logsumexp, where, gather, concat, stack, unstack, split,
    clip_by_norm, clip_by_global_norm,
)
from . import nn, math, random, strings, data, distribute, keras, config, train, test, io, sparse
from .sparse import SparseTensor
from . import linalg, summary

# TensorFlow's default placement: weights and steps on the first GPU where one is present.
_dtrain._set_default_placement("auto")

__version__ = "0.1.0"

__all__ = [
    "Tensor", "Variable", "errors", "DType", "float32", "bfloat16", "float16", "half", "int32", "int64", "uint8", "float64", "string",
    "constant", "convert_to_tensor", "zeros", "ones", "fill", "zeros_like", "ones_like", "function",
    "reduce_sum", "reduce_mean", "matmul", "add", "add_n", "subtract", "multiply", "divide", "square", "sqrt", "exp", "log",
    "abs", "reshape", "one_hot", "clip_by_value", "stop_gradient", "TensorSpec", "GradientTape",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "argmax", "argmin", "reduce_all",
    "reduce_any", "cast", "shape", "size", "rank", "range", "device",
    "reduce_max", "reduce_min", "reduce_prod", "reduce_logsumexp", "where", "gather", "concat", "stack", "unstack",
    "split", "clip_by_norm", "clip_by_global_norm", "linalg", "summary",
    "nn", "math", "random", "strings", "data", "distribute", "keras", "config", "train", "test", "io", "sparse",
    "SparseTensor",
]
