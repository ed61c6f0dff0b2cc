"""tf.nn: activations and the loss helpers custom loops under a strategy use."""
from . import _core, _dtrain

relu = _dtrain.ops.relu
sigmoid = _dtrain.ops.sigmoid
tanh = _dtrain.ops.tanh
softmax = _dtrain.ops.softmax
log_softmax = _dtrain.ops.log_softmax


def gelu(features, approximate=False, name=None):
    """GELU: exact (x · Φ(x)), or with approximate its tanh form, as tf.nn.gelu."""
    del name
    return _dtrain.ops.gelu(features, bool(approximate))


def scale_regularization_loss(regularization_loss):
    """The regularization loss divided by the replicas in sync (inside strategy.run), so
    that the replicas' gradients add up to it once."""
    return _dtrain.ops.scale_regularization_loss(regularization_loss)


def l2_loss(t, name=None):
    """sum(t ** 2) / 2."""
    del name
    return _dtrain.ops.multiply(_dtrain.ops.reduce_sum(_dtrain.ops.square(t), None, False), 0.5)


def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
    """sum(per_example_loss) / global_batch_size: each replica's share of the mean over the
    global batch (without one: this replica's batch times the replicas in sync)."""
    if sample_weight is not None:
        raise NotImplementedError("compute_average_loss(sample_weight=...) is not supported by dtrain")
    if global_batch_size is None:
        return _dtrain.ops.compute_average_loss(per_example_loss, -1)
    try:
        value = float(global_batch_size)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(global_batch_size, bool) or not value.is_integer() or value <= 0:
        raise ValueError(f"compute_average_loss: global_batch_size must be a whole number > 0, got {global_batch_size!r}")
    return _dtrain.ops.compute_average_loss(per_example_loss, int(value))


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """-log softmax(logits)[label] per example (labels int [batch], logits [batch, classes]),
    with the gradient to the logits."""
    del name
    logits = logits if isinstance(logits, (_dtrain.Tensor, _dtrain.Variable)) else _core.convert_to_tensor(logits)
    classes = int(logits.shape[-1])
    one_hot = _dtrain.ops.one_hot(_core.convert_to_tensor(labels, _core.int32), classes)
    return _dtrain.ops.multiply(_dtrain.ops.reduce_sum(_dtrain.ops.multiply(one_hot, log_softmax(logits)), -1, False), -1.0)


def softmax_cross_entropy_with_logits(labels, logits, axis=-1, name=None):
    """-sum(labels * log softmax(logits)) over the classes (the last axis), per example,
    with gradients to both."""
    del name
    if axis not in (-1, len(logits.shape) - 1):
        raise NotImplementedError("softmax_cross_entropy_with_logits(axis=...) takes the classes on the last axis in dtrain")
    return _dtrain.ops.multiply(_dtrain.ops.reduce_sum(_dtrain.ops.multiply(labels, log_softmax(logits)), -1, False), -1.0)
