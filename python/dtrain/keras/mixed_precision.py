"""tf.keras.mixed_precision: dtype policies and LossScaleOptimizer.

"mixed_bfloat16" and "mixed_float16" keep variables, outputs and gradients in float32 and
run the matmuls and convolutions on 16-bit copies of their inputs; "float32" is the
default. set_global_policy applies to layers made afterwards, as in Keras. A model with
"mixed_float16" layers trains with a dynamic loss scale (LossScaleOptimizer), which
compile() adds."""
import numpy as np

from .. import _dtrain
from . import optimizers as _optimizers

_k = _dtrain.keras
_DTYPES = {"float32": ("float32", "float32"), "mixed_bfloat16": ("bfloat16", "float32"),
           "mixed_float16": ("float16", "float32")}


class Policy:
    """A dtype policy: compute_dtype and variable_dtype of the layers that take it."""

    def __init__(self, name):
        if not isinstance(name, str):
            raise TypeError(f"Policy: the name is a string, got {type(name).__name__}")
        if name not in _DTYPES:
            raise ValueError(f"Policy: '{name}' is not a policy dtrain has ({', '.join(_DTYPES)})")
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

    The loss is multiplied by a scale before backward, so that gradients too small for
    float16 survive, and the gradients divided by it before the update. With a dynamic
    scale a step whose gradients are not all finite is skipped (no weight, slot or
    iteration changes, as Keras 3's does; TensorFlow 2's counted the iteration) and the
    scale halves; after dynamic_growth_steps finite steps it doubles. A fixed scale
    (dynamic=False) only multiplies and divides, as TensorFlow 2's did.

    compile() under the "mixed_float16" policy adds one itself, as Keras does. In a custom
    loop: Keras 3's scale_loss(loss), then apply_gradients on the scaled gradients (it
    unscales them), or TensorFlow 2's get_scaled_loss(loss), get_unscaled_gradients(grads)
    and apply_gradients on the unscaled ones. The scale and its count live in the inner
    optimizer, which checkpoints and model.save keep with its slots; the inner optimizer's
    own apply_gradients stays the plain update."""

    def __init__(self, inner_optimizer, dynamic=True, initial_scale=2.0 ** 15, dynamic_growth_steps=2000, name=None,
                 **kwargs):
        del name
        if kwargs:
            raise TypeError("LossScaleOptimizer: unexpected argument(s) " + ", ".join(sorted(kwargs)))
        if isinstance(inner_optimizer, LossScaleOptimizer):
            raise TypeError("LossScaleOptimizer: inner_optimizer is a LossScaleOptimizer already")
        if not isinstance(inner_optimizer, _optimizers.Optimizer):
            raise TypeError("LossScaleOptimizer: inner_optimizer must be a tf.keras.optimizers.Optimizer, got "
                            f"{type(inner_optimizer).__name__}")
        if not np.isfinite(initial_scale) or not initial_scale >= 1:
            raise ValueError(f"LossScaleOptimizer: initial_scale must be a finite number >= 1, got {initial_scale}")
        if int(dynamic_growth_steps) < 1:
            raise ValueError(f"LossScaleOptimizer: dynamic_growth_steps must be >= 1, got {dynamic_growth_steps}")
        self.inner_optimizer = inner_optimizer
        self.dynamic = bool(dynamic)
        self.initial_scale = float(initial_scale)
        self.dynamic_growth_steps = int(dynamic_growth_steps)
        inner_optimizer._set_loss_scale(self.dynamic, self.initial_scale, self.dynamic_growth_steps)
        self._unscale_in_apply = True  # Keras 3's way until the TensorFlow 2 calls are used

    @property
    def loss_scale(self):
        return _dtrain.Tensor(np.asarray(self.inner_optimizer._loss_scale, np.float32), "float32")

    @property
    def dynamic_scale(self):  # Keras 3's name
        return self.loss_scale

    @property
    def dynamic_counter(self):
        return self.inner_optimizer._loss_scale_good_steps

    def scale_loss(self, loss):
        """Keras 3: the loss times the scale; apply_gradients then unscales the gradients."""
        self._unscale_in_apply = True
        return _dtrain.ops.multiply(loss, self.inner_optimizer._loss_scale)

    def get_scaled_loss(self, loss):
        """TensorFlow 2: the loss times the scale; unscale with get_unscaled_gradients."""
        self._unscale_in_apply = False
        return _dtrain.ops.multiply(loss, self.inner_optimizer._loss_scale)

    def get_unscaled_gradients(self, grads):
        self._unscale_in_apply = False
        inverse = 1.0 / self.inner_optimizer._loss_scale
        return [None if g is None else _dtrain.ops.multiply(g, inverse) for g in grads]

    def apply_gradients(self, grads_and_vars, **kwargs):
        """Checks the gradients and applies them, or skips the step (see the class)."""
        if kwargs:
            raise TypeError("LossScaleOptimizer.apply_gradients: unexpected argument(s) " + ", ".join(sorted(kwargs)))
        if self._unscale_in_apply:
            self.inner_optimizer._apply_scaled_gradients(grads_and_vars)
        else:
            self.inner_optimizer._apply_unscaled_gradients(grads_and_vars)

    def apply(self, grads, trainable_variables=None):  # Keras 3
        if trainable_variables is None:
            raise ValueError("LossScaleOptimizer.apply: give the trainable_variables the gradients belong to")
        self.apply_gradients(zip(grads, trainable_variables))

    def __getattr__(self, name):  # learning_rate, iterations, variables, ...: the inner optimizer's
        if name.startswith("_") or name == "inner_optimizer":
            raise AttributeError(name)
        return getattr(self.inner_optimizer, name)
