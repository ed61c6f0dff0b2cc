"""tf.keras over dtrain: Sequential models, layers, optimizers, losses, metrics, callbacks."""
from . import (
    layers, optimizers, losses, metrics, callbacks, utils, models, initializers, datasets, activations, regularizers,
    constraints, mixed_precision,
)
from .models import Model, Sequential, Input

__all__ = ["layers", "optimizers", "losses", "metrics", "callbacks", "utils", "models", "initializers", "datasets",
           "activations", "regularizers", "constraints", "mixed_precision", "Model", "Sequential", "Input"]
