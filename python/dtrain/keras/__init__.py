"""tf.keras over dtrain: Sequential models, layers, optimizers, losses, metrics, callbacks."""
from . import (
    layers, optimizers, losses, metrics, callbacks, utils, models, initializers, datasets, activations, regularizers,
    constraints,
)
from .models import Model, Sequential, Input

__all__ = ["layers", "optimizers", "losses", "metrics", "callbacks", "utils", "models", "initializers", "datasets",
           "activations", "regularizers", "constraints", "Model", "Sequential", "Input"]
