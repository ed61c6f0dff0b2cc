"""tf.keras.metrics: accuracy and mean metrics for custom loops; compile takes their names."""
from .. import _dtrain

_m = _dtrain.keras.metrics
Metric = _m.Metric
SparseCategoricalAccuracy = _m.SparseCategoricalAccuracy
CategoricalAccuracy = _m.CategoricalAccuracy
Mean = _m.Mean


def _name_of(metric):
    if isinstance(metric, str):
        return metric
    if isinstance(metric, SparseCategoricalAccuracy):
        return "sparse_categorical_accuracy"
    if isinstance(metric, CategoricalAccuracy):
        return "categorical_accuracy"
    raise TypeError(f"compile(metrics=...): dtrain takes metric names and accuracy metrics, got {metric!r}")
