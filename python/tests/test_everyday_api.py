"""The calls TensorFlow programs' loops make every day, beyond the tutorials: callbacks that
steer fit (ReduceLROnPlateau, ModelCheckpoint(save_best_only=True)), and the ops custom
loops select, join and clip with, each with its gradient."""
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


def test_the_ops_custom_loops_make_with_their_gradients():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(3, 4)).astype(np.float32)
    b = rng.normal(size=(2, 4)).astype(np.float32)
    x, y = tf.Variable(a), tf.Variable(b)
    with tf.GradientTape() as tape:
        joined = tf.concat([x, y], axis=0)
        stacked = tf.stack([tf.reshape(x, (12,)), tf.reshape(tf.concat([y, tf.zeros((1, 4))], 0), (12,))])
        first, rest = tf.split(joined, [1, -1], axis=0)
        picked = tf.gather(joined, [4, 0, 4])
        chosen = tf.where(tf.greater(joined, 0.0), joined, tf.zeros_like(joined))
        loss = (tf.reduce_sum(tf.square(picked)) + tf.reduce_sum(chosen) + tf.reduce_max(rest) +
                tf.reduce_sum(first) + tf.reduce_sum(stacked))
    gx, gy = tape.gradient(loss, [x, y])
    all_rows = np.concatenate([a, b])
    want = np.zeros_like(all_rows)
    for r in (4, 0, 4):
        want[r] += 2 * all_rows[r]
    want += all_rows > 0
    rest_rows = all_rows[1:]
    want[1:][np.unravel_index(np.argmax(rest_rows), rest_rows.shape)] += 1
    want[0] += 1
    want += 1  # the stack holds every value of x and y once
    np.testing.assert_allclose(np.concatenate([gx.numpy(), gy.numpy()]), want, rtol=1e-6)
    assert tf.stack([tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])], axis=1).numpy().tolist() == [[1, 3], [2, 4]]
    assert tf.where([[1, 0], [0, 1]]).numpy().tolist() == [[0, 0], [1, 1]]
    with pytest.raises(Exception, match="indices\\[0\\] = 9 is not in \\[0, 5\\)"):
        tf.gather(joined, [9])
    logits = tf.constant(rng.normal(size=(4, 3)).astype(np.float32))
    labels = np.array([0, 2, 1, 2])
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits).numpy()
    shifted = logits.numpy() - logits.numpy().max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    np.testing.assert_allclose(per_example, -log_p[np.arange(4), labels], rtol=1e-5)
    dense = tf.nn.softmax_cross_entropy_with_logits(labels=np.eye(3, dtype=np.float32)[labels], logits=logits).numpy()
    np.testing.assert_allclose(dense, per_example, rtol=1e-5)


def test_clipping_by_norm_and_global_norm_as_tensorflow_does():
    grads = [tf.constant([3.0, 4.0]), None, tf.constant([[12.0]])]
    clipped, norm = tf.clip_by_global_norm(grads, 6.5)
    assert float(norm.numpy()) == pytest.approx(13.0)
    assert clipped[1] is None
    np.testing.assert_allclose(clipped[0].numpy(), [1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(clipped[2].numpy(), [[6.0]], rtol=1e-6)
    same, _ = tf.clip_by_global_norm(grads, 20.0)
    np.testing.assert_allclose(same[0].numpy(), [3.0, 4.0])
    bad, _ = tf.clip_by_global_norm([tf.constant([np.inf, 1.0])], 1.0)
    assert np.isnan(bad[0].numpy()).all()
    assert float(tf.linalg.global_norm(grads).numpy()) == pytest.approx(13.0)
    np.testing.assert_allclose(tf.clip_by_norm(tf.constant([3.0, 4.0]), 1.0).numpy(), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(tf.clip_by_norm(tf.constant([[3.0, 4.0], [0.3, 0.4]]), 1.0, axes=[1]).numpy(),
                               [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
    # The gradient goes through the norm: d/dx of sum(clip_by_norm(x, 1)) at x = (3, 4).
    v = tf.Variable(np.array([3.0, 4.0], np.float32))
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(tf.clip_by_norm(v, 1.0))
    g = tape.gradient(out, v).numpy()
    x0 = np.array([3.0, 4.0])
    want = (np.ones(2) * 5 - x0 * x0.sum() / 5) / 25  # d/dx (sum x / |x|)
    np.testing.assert_allclose(g, want, rtol=1e-5)
