"""tf.keras.activations: the functions, whose names a layer's config keeps."""
from .. import _dtrain

relu = _dtrain.ops.relu
sigmoid = _dtrain.ops.sigmoid
tanh = _dtrain.ops.tanh
softmax = _dtrain.ops.softmax


def gelu(x, approximate=False):
    """keras.activations.gelu: exact by default, the tanh form with approximate."""
    return _dtrain.ops.gelu(x, bool(approximate))
