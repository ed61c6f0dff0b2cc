"""tf.keras.activations: the functions, whose names a layer's config keeps."""
from .. import _dtrain

relu = _dtrain.ops.relu
sigmoid = _dtrain.ops.sigmoid
tanh = _dtrain.ops.tanh
softmax = _dtrain.ops.softmax
