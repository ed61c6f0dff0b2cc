"""keras_hub.layers: the layers dtrain has (its model layers live in tf.keras.layers)."""
from ..keras.layers import PositionEmbedding

__all__ = ["PositionEmbedding"]
