"""tf.nn: activations and the loss helpers custom loops under a strategy use."""
from . import _dtrain

relu = _dtrain.ops.relu
sigmoid = _dtrain.ops.sigmoid
tanh = _dtrain.ops.tanh
softmax = _dtrain.ops.softmax
log_softmax = _dtrain.ops.log_softmax


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
