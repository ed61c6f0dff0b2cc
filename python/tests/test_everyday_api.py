"""The calls TensorFlow programs' loops make every day, beyond the tutorials: callbacks that
steer fit (ReduceLROnPlateau, ModelCheckpoint(save_best_only=True))."""
import numpy as np
import pytest

import dtrain as tf


def _data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(128, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    return x, y


def _model():
    tf.keras.utils.set_random_seed(2)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def test_reduce_lr_on_plateau_cuts_the_rate_as_keras_does():
    x, y = _data()
    model = _model()
    rates = []
    probe = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: rates.append(
        float(model.optimizer.learning_rate.numpy() if hasattr(model.optimizer.learning_rate, "numpy")
              else model.optimizer.learning_rate)))
    # No epoch after the first improves by 1e9: a cut every 2 epochs, then a cooldown epoch.
    plateau = tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=2, min_delta=1e9, cooldown=1)
    model.fit(x, y, epochs=6, batch_size=32, verbose=0, callbacks=[plateau, probe])
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    with pytest.raises(Exception, match="factor must be in"):
        tf.keras.callbacks.ReduceLROnPlateau(factor=2.0)


def test_model_checkpoint_keeps_the_best_epoch_only(tmp_path):
    x, y = _data()
    model = _model()
    path = str(tmp_path / "best.weights.h5")
    saved = []

    class Watch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            import os
            saved.append(os.path.getmtime(path) if os.path.exists(path) else None)

    best = tf.keras.callbacks.ModelCheckpoint(path, monitor="val_accuracy", save_best_only=True, save_weights_only=True)
    history = model.fit(x, y, epochs=4, batch_size=32, validation_split=0.25, verbose=0, callbacks=[best, Watch()])
    accuracy = history.history["val_accuracy"]
    assert saved[0] is not None
    for epoch in range(1, 4):
        improved = accuracy[epoch] > max(accuracy[:epoch])
        assert (saved[epoch] != saved[epoch - 1]) == improved or saved[epoch] == saved[epoch - 1] and not improved
