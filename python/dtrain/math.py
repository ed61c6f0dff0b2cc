"""tf.math: the element-wise ops, reductions and comparisons (the same functions as at the top level)."""
from ._core import (
    abs, add, add_n, argmax, argmin, divide, equal, exp, greater, greater_equal, less, less_equal, log, multiply,
    not_equal, reduce_all, reduce_any, reduce_euclidean_norm, reduce_logsumexp, reduce_max, reduce_mean, reduce_min,
    reduce_prod, reduce_std, reduce_sum, reduce_variance, sqrt, square, subtract,
)
from .nn import sigmoid, tanh  # noqa: F401 (tf.math.sigmoid, tf.math.tanh)

__all__ = [
    "abs", "add", "add_n", "argmax", "argmin", "divide", "equal", "exp", "greater", "greater_equal", "less", "less_equal",
    "log", "multiply", "not_equal", "reduce_all", "reduce_any", "reduce_euclidean_norm", "reduce_logsumexp",
    "reduce_max", "reduce_mean", "reduce_min", "reduce_prod", "reduce_std", "reduce_sum", "reduce_variance", "sqrt",
    "square", "subtract", "sigmoid", "tanh",
]
