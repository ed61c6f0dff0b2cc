"""The calls TensorFlow programs' loops make every day, beyond the tutorials: callbacks that
steer fit (ReduceLROnPlateau, ModelCheckpoint(save_best_only=True)), and the ops custom
loops select, join and clip with, each with its gradient."""
import json

import numpy as np
import pytest

import dtrain as tf
from wire import fields


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
    # batch_dims: each example takes from its own row; reduce_prod's gradient at a zero.
    scores = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    taken = tf.gather(scores, [[2, 0], [1, 1]], axis=1, batch_dims=1).numpy()
    np.testing.assert_array_equal(taken, np.take_along_axis(scores, np.array([[2, 0], [1, 1]])[:, :, None], axis=1))
    assert tf.gather(scores[:, 0], [[3], [0]], batch_dims=1).numpy().tolist() == [[3], [12]]
    factors = tf.Variable([[2.0, 0.0, 4.0], [1.0, 3.0, 5.0]])
    with tf.GradientTape() as product_tape:
        product = tf.reduce_sum(tf.math.reduce_prod(factors, axis=1))
    assert float(product.numpy()) == 15.0
    np.testing.assert_array_equal(product_tape.gradient(product, factors).numpy(), [[0, 8, 0], [15, 5, 3]])
    # The other tf.math.reduce_*: values as numpy's; logsumexp stable at large values, its
    # gradient the softmax.
    wide = rng.normal(size=(3, 5)).astype(np.float32) * 4
    np.testing.assert_allclose(tf.math.reduce_variance(wide, axis=1).numpy(), wide.var(1), rtol=1e-5)
    np.testing.assert_allclose(tf.math.reduce_std(wide, axis=0, keepdims=True).numpy(), wide.std(0, keepdims=True),
                               rtol=1e-5)
    np.testing.assert_allclose(tf.math.reduce_euclidean_norm(wide).numpy(), np.linalg.norm(wide), rtol=1e-5)
    shifted = tf.Variable(wide + 500.0)
    with tf.GradientTape() as lse_tape:
        lse = tf.reduce_logsumexp(shifted, axis=1)
    exact = 500.0 + np.log(np.exp(wide.astype(np.float64)).sum(1))
    np.testing.assert_allclose(lse.numpy(), exact, rtol=1e-6)
    soft = np.exp(wide - wide.max(1, keepdims=True))
    np.testing.assert_allclose(lse_tape.gradient(lse, shifted).numpy(), soft / soft.sum(1, keepdims=True), atol=1e-5)
    assert tf.reduce_logsumexp(tf.constant([[-np.inf, -np.inf]]), axis=1).numpy().tolist() == [-np.inf]
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


def test_summaries_from_a_custom_loop_are_tensorboards_event_files(tmp_path):
    import struct

    writer = tf.summary.create_file_writer(str(tmp_path / "train"))
    assert tf.summary.scalar("ignored", 1.0, step=0) is False  # no default writer
    with writer.as_default(step=3):
        assert tf.summary.scalar("loss", tf.constant(0.25)) is True
        tf.summary.scalar("lr", 0.5, step=tf.Variable(7, dtype=tf.int64))
        tf.summary.histogram("weights", np.arange(10, dtype=np.float32), step=8)
        tf.summary.histogram("five", np.arange(10, dtype=np.float32), step=8, buckets=5)
        with pytest.raises(ValueError, match="buckets must be at least 1"):
            tf.summary.histogram("none", [1.0], step=8, buckets=0)
        tf.summary.text("note", "**hello**", step=9)
        with tf.summary.record_if(False):
            assert tf.summary.scalar("skipped", 1.0) is False
    with pytest.raises(ValueError, match="no step given and none set"):
        with writer.as_default():
            tf.summary.scalar("x", 1.0)
    writer.close()
    files = list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert len(files) == 1
    events = [dict(fields(r.numpy())) for r in tf.data.TFRecordDataset(str(files[0]))]
    assert events[0][3] == b"brain.Event:2"  # file_version
    summaries = {}
    for event in events[1:]:
        value = dict(fields(dict(fields(event[5]))[1]))  # Event.summary -> Summary.value
        summaries[value[1].decode()] = (event[2], value)
    assert summaries["loss"][0] == 3 and struct.unpack("<f", summaries["loss"][1][2])[0] == 0.25
    assert summaries["lr"][0] == 7
    assert summaries["weights"][0] == 8 and 5 in summaries["weights"][1]  # a HistogramProto
    assert summaries["note"][0] == 9 and b"**hello**" in summaries["note"][1][8]
    five = dict(fields(summaries["five"][1][5]))
    assert struct.unpack("<5d", five[7]) == (2.0,) * 5  # bucket counts: two of 0..9 in each fifth
    assert struct.unpack("<5d", five[6])[-1] == 9.0  # the last bucket's limit is the largest value
    assert len(dict(fields(summaries["weights"][1][5]))[7]) == 30 * 8
    assert set(summaries) == {"loss", "lr", "weights", "five", "note"}


def test_mixed_precision_policy_and_loss_scaling():
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    try:
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
        policy = tf.keras.mixed_precision.global_policy()
        assert (policy.compute_dtype, policy.variable_dtype) == ("bfloat16", "float32")
        x, y = _data()
        model = _model()
        assert '"mixed_bfloat16"' in model.to_json()
        history = model.fit(x, y, epochs=2, batch_size=32, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    # mixed_float16: float16 matmuls, and compile() adds Keras's dynamic loss scale.
    try:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        assert tf.keras.mixed_precision.global_policy().compute_dtype == "float16"
        x, y = _data()
        model = _model()
        assert '"mixed_float16"' in model.to_json()
        history = model.fit(x, y, epochs=2, batch_size=32, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        assert model.optimizer._has_loss_scale and model.optimizer._loss_scale == 2.0 ** 15
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(ValueError, match="not a policy dtrain has"):
        tf.keras.mixed_precision.Policy("mixed_float8")
    # A compile_config's LossScaleOptimizer, as Keras writes it.
    opt = tf.keras.optimizers.deserialize({"class_name": "LossScaleOptimizer", "config": {
        "inner_optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.002}}, "initial_scale": 1024.0,
        "dynamic_growth_steps": 100, "name": "loss_scale_optimizer", "weight_decay": None, "clipnorm": None,
        "global_clipnorm": None, "clipvalue": None, "use_ema": False, "ema_momentum": 0.99,
        "ema_overwrite_frequency": None, "loss_scale_factor": None, "gradient_accumulation_steps": None}})
    assert opt._has_loss_scale and opt._loss_scale == 1024.0 and opt.learning_rate == pytest.approx(0.002)

    # A custom loop: the scaled loss's unscaled gradients are the plain ones (a power of 2),
    # a non-finite step is skipped and halves the scale, finite steps grow it again.
    def loop(opt, scale_way):
        tf.keras.utils.set_random_seed(1)
        w = tf.Variable(np.array([1.0, -2.0], np.float32))
        for step in range(4):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(w)) * float(step + 1)
                if scale_way == "keras3":
                    loss = opt.scale_loss(loss)
                elif scale_way == "tf2":
                    loss = opt.get_scaled_loss(loss)
            grads = tape.gradient(loss, [w])
            if scale_way == "tf2":
                grads = opt.get_unscaled_gradients(grads)
            opt.apply_gradients(zip(grads, [w]))
        return w.numpy()

    plain = loop(tf.keras.optimizers.SGD(0.01), None)
    for way in ("keras3", "tf2"):
        scaled = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.01), dynamic_growth_steps=3)
        np.testing.assert_array_equal(loop(scaled, way), plain)
        assert float(scaled.loss_scale.numpy()) == 2.0 ** 16  # grew once after 3 finite steps
    opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.01))
    w = tf.Variable(np.array([1.0], np.float32))
    opt.apply_gradients([(tf.constant([np.inf]), w)])
    assert w.numpy().tolist() == [1.0] and float(opt.loss_scale.numpy()) == 2.0 ** 14
    assert float(opt.learning_rate.numpy() if hasattr(opt.learning_rate, "numpy") else opt.learning_rate) == \
        pytest.approx(0.01)


def test_the_keras_layers_people_reach_for():
    rng = np.random.default_rng(11)
    # Sequences [batch, steps, channels] through Normalization (adapted), Conv1D and MaxPooling1D.
    x = (rng.normal(size=(96, 12, 2)) * [3.0, 0.5] + [10.0, -4.0]).astype(np.float32)
    y = (x[:, :, 0].mean(1) > 10.0).astype(np.int32)
    norm = tf.keras.layers.Normalization()
    norm.adapt(tf.data.Dataset.from_tensor_slices(x).batch(10))
    mean = np.asarray(norm.get_config()["mean"])
    np.testing.assert_allclose(mean, x.reshape(-1, 2).mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.get_config()["variance"], x.reshape(-1, 2).var(0), rtol=1e-5)
    tf.keras.utils.set_random_seed(4)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(12, 2)), norm,
        tf.keras.layers.Conv1D(8, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling1D(2), tf.keras.layers.Conv1D(4, 2, padding="causal", dilation_rate=2),
        tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(2)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    first = model.fit(x, y, epochs=8, batch_size=16, verbose=0).history
    assert first["loss"][-1] < first["loss"][0]
    out = model.predict(x[:4], verbose=0)
    back = tf.keras.models.model_from_json(model.to_json())
    back.set_weights(model.get_weights())
    np.testing.assert_allclose(back.predict(x[:4], verbose=0), out, rtol=1e-5)
    config = json.loads(model.to_json())["config"]["layers"]
    kinds = [layer["class_name"] for layer in config]
    assert "Conv1D" in kinds and "MaxPooling1D" in kinds and "Normalization" in kinds
    assert model.layers[1].get_weights()[0].shape == (3, 2, 8)  # Keras's Conv1D kernel layout

    # Normalization per step (axis 1) and over everything (axis None), adapted and in the JSON.
    by_step = tf.keras.layers.Normalization(axis=1)
    by_step.adapt(x)
    np.testing.assert_allclose(by_step.get_config()["mean"], x.mean(axis=(0, 2)), rtol=1e-5)
    steps = tf.keras.Sequential([tf.keras.Input(shape=(12, 2)), by_step])
    want = (x - x.mean(axis=(0, 2))[None, :, None]) / np.sqrt(x.var(axis=(0, 2)))[None, :, None]
    np.testing.assert_allclose(steps.predict(x[:4], verbose=0), want[:4], rtol=1e-4, atol=1e-5)
    assert steps.layers[0].get_weights()[0].shape == (12,)
    restored = tf.keras.models.model_from_json(steps.to_json())
    assert json.loads(restored.to_json())["config"]["layers"][0]["config"]["axis"] == 1
    restored.set_weights(steps.get_weights())
    np.testing.assert_allclose(restored.predict(x[:4], verbose=0), want[:4], rtol=1e-4, atol=1e-5)
    overall = tf.keras.layers.Normalization(axis=None)
    overall.adapt(x)
    assert np.asarray(overall.get_config()["mean"]).reshape(-1) == pytest.approx([x.mean()], rel=1e-5)
    np.testing.assert_allclose(overall(x[:2]).numpy(), (x[:2] - x.mean()) / x.std(), rtol=1e-4, atol=1e-5)

    ids = tf.constant([[0, 2, 2], [3, 1, 1]])
    counted = tf.keras.layers.CategoryEncoding(num_tokens=4, output_mode="count")
    assert tf.keras.Sequential([tf.keras.Input(shape=(3,)), counted]).predict(ids, verbose=0).tolist() == \
        [[1, 0, 2, 0], [0, 2, 0, 1]]

    images = rng.normal(size=(4, 6, 6, 1)).astype(np.float32)
    augment = tf.keras.Sequential([tf.keras.Input(shape=(6, 6, 1)), tf.keras.layers.RandomFlip("horizontal", seed=3),
                                   tf.keras.layers.RandomCrop(4, 4, seed=5)])
    at_inference = augment.predict(images, verbose=0)
    np.testing.assert_array_equal(at_inference, images[:, 1:5, 1:5, :])  # the centre, unflipped
    training = augment(images, training=True).numpy()
    assert training.shape == (4, 4, 4, 1)
    turn = tf.keras.Sequential([tf.keras.Input(shape=(6, 6, 1)), tf.keras.layers.RandomRotation((0.25, 0.25), seed=2)])
    np.testing.assert_allclose(turn(images, training=True).numpy(), np.rot90(images, 1, axes=(1, 2)), atol=1e-5)
    np.testing.assert_array_equal(turn.predict(images, verbose=0), images)
    assert json.loads(turn.to_json())["config"]["layers"][0]["config"]["factor"] == [0.25, 0.25]
