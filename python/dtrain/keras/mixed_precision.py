"""tf.keras.mixed_precision: dtype policies and LossScaleOptimizer.

"mixed_bfloat16" keeps variables, outputs and gradients in float32 and runs the matmuls on
bfloat16 copies of their inputs; "float32" is the default. set_global_policy applies to
layers made afterwards, as in Keras."""
import numpy as np

from .. import _dtrain
from . import optimizers as _optimizers

_k = _dtrain.keras
_DTYPES = {"float32": ("float32", "float32"), "mixed_bfloat16": ("bfloat16", "float32")}


class Policy:
    """A dtype policy: compute_dtype and variable_dtype of the layers that take it."""

    def __init__(self, name):
        if not isinstance(name, str):
            raise TypeError(f"Policy: the name is a string, got {type(name).__name__}")
        if name not in _DTYPES:
            raise ValueError(f"Policy: '{name}' is not a policy dtrain has ({', '.join(_DTYPES)}; mixed_float16 "
                             "is refused: dtrain's mixed precision on CPUs is bfloat16)")
        self.name = name
        self.compute_dtype, self.variable_dtype = _DTYPES[name]

    def __eq__(self, other):
        return isinstance(other, Policy) and other.name == self.name

    def __repr__(self):
        return f'<Policy "{self.name}">'


def set_global_policy(policy):
    """The policy layers made from now on take (a Policy or its name; None: float32)."""
    name = "float32" if policy is None else policy.name if isinstance(policy, Policy) else Policy(str(policy)).name
    _k._set_global_policy(name)


def global_policy():
    return Policy(_k._global_policy())


class LossScaleOptimizer:
    """tf.keras.mixed_precision.LossScaleOptimizer(inner_optimizer, dynamic=True,
    initial_scale=2**15, dynamic_growth_steps=2000).

    In a custom loop: Keras 3's scale_loss(loss), then apply_gradients on the scaled
    gradients (it unscales them), or TensorFlow 2's get_scaled_loss(loss),
    get_unscaled_gradients(grads) and apply_gradients on the unscaled ones. A step whose
    gradients are not all finite is skipped and, when dynamic, the scale halves; after
    dynamic_growth_steps finite steps it doubles. In compile/fit the inner optimizer trains:
    dtrain's gradients are float32 under every policy it has, where a loss scale changes
    nothing."""

    def __init__(self, inner_optimizer, dynamic=True, initial_scale=2.0 ** 15, dynamic_growth_steps=2000, name=None,
                 **kwargs):
        del name
        if kwargs:
            raise TypeError("LossScaleOptimizer: unexpected argument(s) " + ", ".join(sorted(kwargs)))
        if not isinstance(inner_optimizer, _optimizers.Optimizer):
            raise TypeError("LossScaleOptimizer: inner_optimizer must be a tf.keras.optimizers.Optimizer, got "
                            f"{type(inner_optimizer).__name__}")
        if not initial_scale > 0 or not np.isfinite(initial_scale):
            raise ValueError(f"LossScaleOptimizer: initial_scale must be a positive number, got {initial_scale}")
        self.inner_optimizer = inner_optimizer
        self.dynamic = bool(dynamic)
        self.initial_scale = float(initial_scale)
        self.dynamic_growth_steps = int(dynamic_growth_steps)
        self._scale = float(initial_scale)
        self._good_steps = 0
        self._unscale_in_apply = True  # Keras 3's way until the TensorFlow 2 calls are used

    @property
    def loss_scale(self):
        return _dtrain.Tensor(np.asarray(self._scale, np.float32), "float32")

    @property
    def dynamic_counter(self):
        return self._good_steps

    def scale_loss(self, loss):
        """Keras 3: the loss times the scale; apply_gradients then unscales the gradients."""
        self._unscale_in_apply = True
        return _dtrain.ops.multiply(loss, self._scale)

    def get_scaled_loss(self, loss):
        """TensorFlow 2: the loss times the scale; unscale with get_unscaled_gradients."""
        self._unscale_in_apply = False
        return _dtrain.ops.multiply(loss, self._scale)

    def get_unscaled_gradients(self, grads):
        self._unscale_in_apply = False
        return [None if g is None else _dtrain.ops.multiply(g, 1.0 / self._scale) for g in grads]

    def apply_gradients(self, grads_and_vars, **kwargs):
        pairs = list(grads_and_vars)
        finite = all(g is None or bool(np.isfinite(np.asarray(g.numpy())).all()) for g, _ in pairs)
        if not finite:
            if self.dynamic:
                self._scale = max(self._scale / 2.0, 1.0)
                self._good_steps = 0
            return None  # the step is skipped
        if self._unscale_in_apply:
            pairs = [(None if g is None else _dtrain.ops.multiply(g, 1.0 / self._scale), v) for g, v in pairs]
        result = self.inner_optimizer.apply_gradients(pairs, **kwargs)
        if self.dynamic:
            self._good_steps += 1
            if self._good_steps >= self.dynamic_growth_steps:
                self._scale *= 2.0
                self._good_steps = 0
        return result

    def __getattr__(self, name):  # learning_rate, iterations, variables, ...: the inner optimizer's
        if name.startswith("_") or name == "inner_optimizer":
            raise AttributeError(name)
        return getattr(self.inner_optimizer, name)
