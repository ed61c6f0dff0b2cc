"""The package's own behaviour: numpy without copies, gradients against finite differences,
callbacks, Ctrl-C, errors as Python exceptions that name the thing, datasets, strategy.run."""
import os
import signal

import numpy as np
import pytest

import dtrain as tf
from loops import train_custom_loop


def test_arrays_of_the_tensors_dtype_are_shared_not_copied():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tf.convert_to_tensor(a)
    assert t.shape == (3, 4) and t.dtype == "float32"
    assert np.shares_memory(t.numpy(), a)
    a[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0
    # The other way: the array numpy() gives is the tensor's memory.
    u = tf.matmul(t, tf.ones((4, 2)))
    assert np.shares_memory(u.numpy(), u.numpy())
    np.testing.assert_array_equal(u.numpy(), a @ np.ones((4, 2), np.float32))


def test_other_arrays_convert_as_keras_converts_inputs():
    assert tf.convert_to_tensor(np.ones((2, 2))).dtype == "float32"  # float64
    labels = tf.convert_to_tensor(np.array([1, 2, 3], dtype=np.int64))
    assert labels.dtype == "int32" and list(labels.numpy()) == [1, 2, 3]
    assert tf.convert_to_tensor(np.ones((4, 3), np.float32)[:, 1]).numpy().flags.c_contiguous
    with pytest.raises(ValueError, match="fit y: values from 0 to 5000000000 do not fit int32"):
        tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(1,))]).fit(
            np.zeros((2, 1), np.float32), np.array([0, 5_000_000_000]), verbose=0)
    with pytest.raises(TypeError, match="fit x: an array of object"):
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(1,))])
        model.compile("adam", "mse")
        model.fit(np.array([[object()]]), np.zeros((1, 2), np.float32), verbose=0)


def test_the_tapes_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    w = tf.Variable(rng.normal(size=(4, 3)).astype(np.float32), name="w")

    def loss_of(values):
        return float(np.sum(np.tanh(x.astype(np.float64) @ values) ** 2))

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(tf.nn.tanh(tf.matmul(x, w))))
    grad = tape.gradient(loss, w).numpy()  # after the block, as TensorFlow allows
    base = w.numpy().astype(np.float64)
    eps = 1e-3
    for i, j in [(0, 0), (1, 2), (3, 1)]:
        up, down = base.copy(), base.copy()
        up[i, j] += eps
        down[i, j] -= eps
        numeric = (loss_of(up) - loss_of(down)) / (2 * eps)
        assert abs(grad[i, j] - numeric) <= 1e-2 * max(1.0, abs(numeric))


def test_a_tape_answers_once_unless_persistent():
    v = tf.Variable(np.array([2.0], np.float32))
    with tf.GradientTape(persistent=True) as tape:
        y = v * v
    assert tape.gradient(y, v).numpy()[0] == pytest.approx(4.0)
    assert tape.gradient(y, v).numpy()[0] == pytest.approx(4.0)
    with tf.GradientTape() as once:
        z = v * v
    once.gradient(z, v)
    with pytest.raises(ValueError):
        once.gradient(z, v)
    # A source the target does not depend on has no gradient (None), as in TensorFlow.
    with tf.GradientTape() as tape2:
        y2 = v * 3.0
    assert tape2.gradient(y2, [v, tf.Variable(np.ones(1, np.float32))])[1] is None


def test_an_update_between_the_record_and_gradient_leaves_what_the_tape_read():
    # A GAN's step with one persistent tape: the discriminator is updated first, then the
    # generator's gradient goes through the discriminator's weights as the tape read them.
    d = tf.Variable(np.array([3.0, 4.0], np.float32))
    g = tf.Variable(np.array([1.0, 1.0], np.float32))
    with tf.GradientTape(persistent=True) as tape:
        d_loss = tf.reduce_sum(d * d)
        g_loss = tf.reduce_sum(d * g)
    tf.keras.optimizers.SGD(0.5).apply_gradients([(tape.gradient(d_loss, d), d)])
    np.testing.assert_allclose(d.numpy(), [0.0, 0.0])
    np.testing.assert_allclose(tape.gradient(g_loss, g).numpy(), [3.0, 4.0])
    d.assign([9.0, 9.0])
    np.testing.assert_allclose(tape.gradient(g_loss, g).numpy(), [3.0, 4.0])


def test_a_loss_weighs_each_example_by_its_sample_weight_as_keras_does():
    y_true = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]], np.float32)
    y_pred = tf.Variable(np.zeros((3, 2), np.float32))
    per_example = np.mean(y_true ** 2, axis=1)  # [1, 2, 4.5]
    weights = np.array([1.0, 0.0, 2.0], np.float32)
    mse = tf.keras.losses.MeanSquaredError()
    with tf.GradientTape() as tape:
        loss = mse(y_true, y_pred, sample_weight=weights)
    assert float(loss) == pytest.approx(np.sum(per_example * weights) / 3)  # over the batch, not the weights
    # d/dpred of w_i * mean_j (y - pred)^2 / 3 = -w_i * (y - pred) / 3
    np.testing.assert_allclose(tape.gradient(loss, y_pred).numpy(), -weights[:, None] * y_true / 3, rtol=1e-6)
    assert float(mse(y_true, y_pred, sample_weight=weights[:, None])) == pytest.approx(float(loss))
    assert float(mse(y_true, y_pred, sample_weight=2.0)) == pytest.approx(2 * np.mean(per_example))
    none = tf.keras.losses.MeanSquaredError(reduction="none")
    np.testing.assert_allclose(none(y_true, y_pred, sample_weight=weights).numpy(), per_example * weights)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sample_weight of shape \[2\] does not fit"):
        mse(y_true, y_pred, sample_weight=np.ones(2, np.float32))
    # A one-element weight of any rank is one weight for all: the losses keep their shape.
    assert none(y_true, y_pred, sample_weight=np.full((1, 1, 1), 2.0, np.float32)).shape == (3,)
    with pytest.raises(NotImplementedError, match=r"update_state\(sample_weight=...\) is not supported"):
        tf.keras.metrics.Mean().update_state(np.ones(3, np.float32), sample_weight=weights)
    with pytest.raises(NotImplementedError, match=r"update_state\(sample_weight=...\) is not supported"):
        tf.keras.metrics.Mean().update_state(np.ones(3, np.float32), weights)  # Keras's second argument


def test_a_weight_per_example_weighs_each_of_its_loss_values_as_keras_does():
    # Losses of three examples over two steps each ([3, 2]): a weight per example weighs
    # both of its steps; a weight per step each one.
    rng = np.random.default_rng(3)
    y_true = rng.normal(size=(3, 2, 4)).astype(np.float32)
    y_pred = rng.normal(size=(3, 2, 4)).astype(np.float32)
    per_value = np.mean((y_true - y_pred) ** 2, axis=-1)
    weights = np.array([1.0, 0.0, 2.0], np.float32)
    mse = tf.keras.losses.MeanSquaredError()
    none = tf.keras.losses.MeanSquaredError(reduction="none")
    np.testing.assert_allclose(none(y_true, y_pred, sample_weight=weights).numpy(), per_value * weights[:, None],
                               rtol=1e-6)
    assert float(mse(y_true, y_pred, sample_weight=weights)) == pytest.approx(np.mean(per_value * weights[:, None]))
    assert float(mse(y_true, y_pred, sample_weight=weights[:, None])) == pytest.approx(
        np.mean(per_value * weights[:, None]))
    steps = np.array([[1.0, 0.5], [0.0, 1.0], [2.0, 0.0]], np.float32)
    assert float(mse(y_true, y_pred, sample_weight=steps)) == pytest.approx(np.mean(per_value * steps))
    assert float(mse(y_true, y_pred, sample_weight=steps[:, :, None])) == pytest.approx(np.mean(per_value * steps))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sample_weight of shape \[2\] does not fit the batch's \[3, 2\]"):
        mse(y_true, y_pred, sample_weight=np.ones(2, np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sample_weight of shape \[3, 1, 2\] does not fit"):
        mse(y_true, y_pred, sample_weight=np.ones((3, 1, 2), np.float32))


def test_a_list_of_targets_gives_the_gradient_of_their_sum():
    v = tf.Variable(np.array([2.0, -1.0], np.float32))
    with tf.GradientTape(persistent=True) as tape:
        y1 = v * v               # d/dv: 2v
        y2 = tf.reduce_sum(v * 3.0)  # 3
        y3 = y1 * 5.0            # 10v, and y1 is a target too
    np.testing.assert_allclose(tape.gradient([y1, y2], v).numpy(), [7.0, 1.0])
    np.testing.assert_allclose(tape.gradient((y1, [y3]), v).numpy(), [24.0, -12.0])
    # Each target's own output gradient, in the targets' structure; None is ones.
    for seeds in ([tf.constant([1.0, 0.0]), None], [[1.0, 0.0], None]):
        np.testing.assert_allclose(tape.gradient([y1, y2], v, output_gradients=seeds).numpy(), [7.0, 3.0])
    np.testing.assert_allclose(tape.gradient(y1, v, output_gradients=[tf.constant([0.0, 1.0])]).numpy(), [0.0, -2.0])
    with pytest.raises(ValueError, match="the target's structure, a list of 2 there"):
        tape.gradient([y1, y2], v, output_gradients=[tf.constant([1.0, 1.0])])
    # A list of one target may take its output gradient bare.
    np.testing.assert_allclose(tape.gradient([y1], v, output_gradients=tf.constant([0.0, 1.0])).numpy(), [0.0, -2.0])


def _data(n=2000, features=20, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


def _model(features=20):
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(features,)),
                                 tf.keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_comparisons_argmax_and_cast_give_a_custom_loops_accuracy_as_tensorflow_does():
    logits = tf.constant([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5], [0.0, 0.0, 4.0], [1.0, 1.0, 0.0]])
    labels = tf.constant([1, 2, 2, 0])
    predicted = tf.argmax(logits, axis=1)
    np.testing.assert_array_equal(predicted.numpy(), [1, 0, 2, 0])  # a tie gives the first
    hits = tf.cast(tf.equal(predicted, labels), tf.float32)
    assert hits.dtype == "float32"
    assert float(tf.reduce_mean(hits)) == pytest.approx(0.75)
    np.testing.assert_array_equal((predicted == labels).numpy(), [1, 0, 1, 1])
    np.testing.assert_array_equal((predicted != labels).numpy(), [0, 1, 0, 0])
    np.testing.assert_array_equal(tf.math.argmin(logits, 1).numpy(), [2, 1, 0, 2])
    np.testing.assert_array_equal(tf.argmax(logits).numpy(), [1, 0, 2])  # axis 0, as TensorFlow's default
    # Comparisons broadcast, against numbers and arrays too; a scalar's is a truth value.
    x = tf.constant([1.0, 2.0, 3.0])
    np.testing.assert_array_equal((x > 1.5).numpy(), [0, 1, 1])
    np.testing.assert_array_equal((2.0 <= x).numpy(), [0, 1, 1])
    np.testing.assert_array_equal(tf.math.less(x, np.array([[2.0], [4.0]])).numpy(), [[1, 0, 0], [1, 1, 1]])
    assert bool(tf.constant(0.0) == 0) and not bool(tf.constant(1.0) == 0)
    assert bool(tf.reduce_all(x > 0)) and not bool(tf.reduce_any(x > 3))
    np.testing.assert_array_equal(tf.reduce_any(tf.constant([[0, 1], [0, 0]]), axis=1).numpy(), [1, 0])
    assert (x == None) is False and (x != None) is True  # noqa: E711 (TensorFlow's answer to it)
    assert not bool(x == tf.constant([1.0, 2.0]))  # shapes that do not broadcast: False, as TensorFlow's ==
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"equal: shapes \[3\] and \[2\] do not broadcast"):
        tf.equal(x, [1.0, 2.0])
    # A variable compares by its values too; both are keys only through ref(), as in TensorFlow.
    v = tf.Variable([1.0, 5.0])
    np.testing.assert_array_equal((v == [1.0, 4.0]).numpy(), [1, 0])
    with pytest.raises(TypeError, match=r"unhashable.*\.ref\(\)"):
        {v: 1}
    with pytest.raises(TypeError, match=r"unhashable"):
        {x}
    assert {v.ref(): 1}[v.ref()] == 1 and v.ref().deref() is v and v.ref() != tf.Variable([1.0, 5.0]).ref()
    # cast: to integers truncated toward zero, to bool where not zero; the same dtype is the tensor itself.
    np.testing.assert_array_equal(tf.cast(tf.constant([-1.7, 2.9, 0.0]), tf.int32).numpy(), [-1, 2, 0])
    np.testing.assert_array_equal(tf.cast(tf.constant([-1.7, 0.0]), tf.bool).numpy(), [1, 0])
    assert tf.cast(x, tf.float32) is x
    assert tf.cast(labels, "float32").dtype == "float32"
    assert tf.cast(x, tf.bfloat16).dtype == "bfloat16"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cast: value inf at \[1\] does not fit in int32"):
        tf.cast(tf.constant([1.0, float("inf")]), tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cast: value 30000000000.0 at \[0\] does not fit in int32"):
        tf.cast(np.array([3e10]), tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"argmax: axis 2 is out of range for a tensor of rank 2"):
        tf.argmax(logits, axis=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"argmax: axis 1 of shape \[2, 0\] is empty"):
        tf.argmax(np.zeros((2, 0), np.float32), axis=1)
    with pytest.raises(TypeError, match=r"argmax: axis must be a whole number"):
        tf.argmax(logits, axis=1.5)
    # shape, size, rank and range, as int32 tensors.
    np.testing.assert_array_equal(tf.shape(logits).numpy(), [4, 3])
    assert int(tf.size(logits)) == 12 and int(tf.rank(logits)) == 2
    np.testing.assert_array_equal(tf.range(4).numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(tf.range(1, 7, 2).numpy(), [1, 3, 5])
    np.testing.assert_allclose(tf.range(0.0, 1.0, 0.25).numpy(), [0.0, 0.25, 0.5, 0.75])
    assert tf.range(3).dtype == "int32" and tf.range(3, dtype=tf.float32).dtype == "float32"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"range: delta must not be 0"):
        tf.range(0, 3, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"range: delta must not be 0"):
        tf.range(0.0, 1.0, 0.25, dtype=tf.int32)  # each cast to int32 first, as TensorFlow does
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"range: start 0 does not reach limit 3 by delta -1"):
        tf.range(0, 3, -1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"range: start, limit and delta must be finite"):
        tf.range(0.0, float("inf"))
    np.testing.assert_array_equal(tf.range(tf.Variable(3)).numpy(), [0, 1, 2])
    assert tf.range(np.array(3)).dtype == "int32" and tf.range(3, 0, -1).numpy().tolist() == [3, 2, 1]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cast: value 1099511627776 at \[0\] does not fit in int32"):
        tf.cast(np.array([2**40]), tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"reduce_all: axis 0 is out of range for a tensor of rank 0"):
        tf.reduce_all(tf.constant(1.0), axis=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"reduce_any: axis \[1, -1\] names an axis twice"):
        tf.reduce_any(tf.constant([[0, 1]]), axis=[1, -1])
    np.testing.assert_array_equal(tf.reduce_all(tf.constant([[1, 1], [0, 1]]), axis=tf.constant([-1])).numpy(), [1, 0])
    # None of them is recorded: the tape gives no gradient through a comparison.
    w = tf.Variable([1.0, -2.0])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tf.cast(w > 0, tf.float32) * w)
    np.testing.assert_allclose(tape.gradient(y, w).numpy(), [1.0, 0.0])


def test_powers_and_numbers_on_the_left_are_recorded_as_tensorflow_records_them():
    v = tf.Variable([1.5, 2.0, 3.0])
    x = np.array([1.5, 2.0, 3.0])
    with tf.GradientTape(persistent=True) as tape:
        square = tf.reduce_sum(v ** 2)
        cube = tf.reduce_sum((v - 1.0) ** 3)
        inverse = tf.reduce_sum(v ** -2)
        root = tf.reduce_sum(v ** 0.5)
        other = tf.reduce_sum(v ** 1.5)
        exponential = tf.reduce_sum(2.0 ** v)
        left = tf.reduce_sum(1.0 / v + 2.0 * v - (3.0 - v) + (1.0 + v))
    np.testing.assert_allclose(float(square), np.sum(x ** 2), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(square, v).numpy(), 2 * x, rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(cube, v).numpy(), 3 * (x - 1) ** 2, rtol=1e-6)
    np.testing.assert_allclose(float(inverse), np.sum(x ** -2.0), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(inverse, v).numpy(), -2 * x ** -3.0, rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(root, v).numpy(), 0.5 * x ** -0.5, rtol=1e-5)
    np.testing.assert_allclose(float(other), np.sum(x ** 1.5), rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(other, v).numpy(), 1.5 * x ** 0.5, rtol=1e-5)
    np.testing.assert_allclose(float(exponential), np.sum(2.0 ** x), rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(exponential, v).numpy(), np.log(2.0) * 2.0 ** x, rtol=1e-5)
    np.testing.assert_allclose(float(left), np.sum(1 / x + 2 * x - (3 - x) + (1 + x)), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(left, v).numpy(), -1 / x ** 2 + 4, rtol=1e-5)
    np.testing.assert_allclose((tf.constant(x) ** 0).numpy(), np.ones(3))
    np.testing.assert_allclose((tf.constant(x) ** tf.constant([2.0, 1.0, 0.5])).numpy(), x ** [2.0, 1.0, 0.5],
                               rtol=1e-5)
    assert not np.isfinite(float(tf.constant(-2.0) ** 1.5))  # NaN in TensorFlow
    np.testing.assert_allclose((v / 2.0).numpy(), x / 2)
    kernel = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2))
    rows = np.ones((2, 3), np.float32)
    with tf.GradientTape() as tape:
        product = tf.reduce_sum(rows @ kernel) + tf.reduce_sum(kernel @ tf.constant(np.ones((2, 1), np.float32)))
    np.testing.assert_allclose(float(product), rows.sum(0) @ kernel.numpy().sum(1) + kernel.numpy().sum())
    np.testing.assert_allclose(tape.gradient(product, kernel).numpy(), np.full((3, 2), 3.0))
    # numpy on the left defers to them too: a tensor, recorded, not numpy's array.
    with tf.GradientTape() as tape:
        mixed = x * v + np.ones(3) - v
        total = tf.reduce_sum(mixed)
    assert isinstance(mixed, tf.Tensor)
    np.testing.assert_allclose(tape.gradient(total, v).numpy(), x - 1, rtol=1e-6)
    assert isinstance(np.array([1.0, 2.0, 4.0]) == tf.constant([1.0, 2.0, 3.0]), tf.Tensor)
    np.testing.assert_allclose((np.array([1, 2]) * tf.constant([0.5, 0.25])).numpy(), [0.5, 0.5])  # the tensor's dtype
    with pytest.raises(TypeError):
        v ** "2"


def test_python_callbacks_see_keras_logs_and_stop_training():
    x, y = _data()
    model = _model()
    seen = []

    class StopAt(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((epoch, sorted(logs)))
            if epoch == 2:
                self.model.stop_training = True

    history = model.fit(x, y, epochs=10, validation_split=0.1, verbose=0, callbacks=[StopAt()])
    assert history.epoch == [0, 1, 2]
    assert seen == [(e, ["accuracy", "loss", "val_accuracy", "val_loss"]) for e in range(3)]
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert history.history["accuracy"][-1] > history.history["accuracy"][0]


def test_an_exception_in_a_callback_is_raised_as_itself():
    x, y = _data()

    class Fails(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                raise LookupError("callback gave up at batch 5")

    with pytest.raises(LookupError, match="batch 5"):
        _model().fit(x, y, epochs=1, verbose=0, callbacks=[Fails()])


def test_ctrl_c_ends_fit_after_the_batch_under_way():
    x, y = _data()
    model = _model()

    class Interrupt(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, epochs=5, batch_size=32, verbose=0, callbacks=[Interrupt()])
    # Batches 0..3 were trained, and the one the signal arrived during; no more.
    assert 4 <= model.optimizer.iterations <= 5


def test_bad_input_names_the_thing():
    x, y = _data()
    model = _model()
    with pytest.raises(ValueError, match=r"same number of samples.*\[2000, 20\].*\[10\]"):
        model.fit(x, y[:10], verbose=0)
    with pytest.raises(ValueError, match=r"layer 'dense'.*\[3, 7\]"):
        model(np.zeros((3, 7), np.float32))
    with pytest.raises(ValueError, match="optimizer 'nadam' is not one dtrain has"):
        _model().compile(optimizer="nadam", loss="mse")
    with pytest.raises(TypeError, match="loss: dtrain trains with its own losses"):
        _model().compile(optimizer="adam", loss=lambda a, b: a)
    with pytest.raises(OSError, match="/no/such/file.safetensors"):
        model.load_weights("/no/such/file.safetensors")
    with pytest.raises(TypeError, match="dtype 'complex64'"):
        tf.zeros((2,), dtype="complex64")
    with pytest.raises(TypeError, match=r"metrics must be a list .* got 'accuracy'"):
        _model().compile(optimizer="adam", loss="mse", metrics="accuracy")
    with pytest.raises(MemoryError, match=r"shape \[2147483648, 2147483648\] holds more bytes than memory"):
        tf.zeros((2**31, 2**31))
    # Counts are whole numbers, as range() takes them: 2.9 epochs is not 2.
    with pytest.raises(TypeError, match="fit: epochs must be a whole number, got 2.9"):
        model.fit(x, y, epochs=2.9, verbose=0)
    with pytest.raises(TypeError, match="fit: batch_size must be a whole number, got 32.5"):
        model.fit(x, y, batch_size=32.5, verbose=0)
    with pytest.raises(ValueError, match=r"fit: epochs must fit in 32 bits, got 2147483648"):
        model.fit(x, y, epochs=2**31, verbose=0)
    model.fit(x[:64], y[:64], epochs=np.int64(1), batch_size=np.int32(32), verbose=0)  # numpy integers are whole
    # A generator's element of another shape than its signature's is named, not trained on.

    def rows():
        yield np.zeros((20,), np.float32), 1
        yield np.zeros((21,), np.float32), 1

    wrong = tf.data.Dataset.from_generator(rows, output_signature=(tf.TensorSpec((20,), tf.float32),
                                                                   tf.TensorSpec((), tf.int32)))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"element 1, component 0, has shape \(21,\), not the signature's \(20,\)"):
        list(wrong)
    with pytest.raises(NotImplementedError, match=r"validation_data=\(x, y, sample_weight\)"):
        model.fit(x, y, validation_data=(x, y, np.ones(len(y))), verbose=0)
    with pytest.raises(TypeError, match="with_options takes a tf.data.Options, got dict"):
        tf.data.Dataset.range(3).with_options({"deterministic": True})


def test_layer_arguments_and_inputs_as_numpy_and_keras_give_them():
    # numpy's scalars are arguments like Python's; a number JSON cannot hold is named.
    layer = tf.keras.layers.Dense(np.int64(4), input_shape=(3,))
    assert tf.keras.Sequential([layer]).count_params() == 16
    with pytest.raises(ValueError, match="Dropout: rate must be a finite number, got nan"):
        tf.keras.layers.Dropout(float("nan"))
    with pytest.raises(ValueError, match="BatchNormalization: epsilon must be a finite number, got inf"):
        tf.keras.layers.BatchNormalization(epsilon=np.float32("inf"))
    # Integers and booleans are cast to float32 for the first layer, as Keras casts them.
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
    want = model.predict(np.array([[1, 0, 3]], np.float32), verbose=0)
    np.testing.assert_array_equal(model.predict([[1, 0, 3]], verbose=0), want)
    np.testing.assert_array_equal(model(np.array([[1, 0, 3]])).numpy(), want)
    np.testing.assert_array_equal(model.predict(np.array([[True, False, True]]), verbose=0),
                                  model.predict(np.array([[1, 0, 1]], np.float32), verbose=0))


def test_what_a_tensorflow_user_tries_is_done_or_named(tmp_path):
    # A read-only array is copied: writing through .numpy() segfaulted on a read-only memmap.
    frozen = np.frombuffer(bytes(16), np.float32)
    t = tf.convert_to_tensor(frozen)
    t.numpy()[0] = 5.0
    assert frozen[0] == 0.0 and float(t.numpy()[0]) == 5.0
    with pytest.raises(TypeError, match="a float32 tensor where int32 is asked for"):
        tf.convert_to_tensor(tf.constant([1.5]), dtype=tf.int32)
    assert tf.reshape(tf.zeros((2, 3)), [-1]).shape == (6,)
    with pytest.raises(ValueError, match=r"truth value of a tensor of shape \[2\] is ambiguous"):
        bool(tf.constant([1.0, 2.0]))
    assert bool(tf.constant(2.0)) and not bool(tf.constant([0.0]))
    # Each pass over a reshuffling dataset has its own order, and an iterator checkpointed in
    # one pass and restored into another resumes the saved pass.
    ds = tf.data.Dataset.range(20).shuffle(20, seed=3)
    assert [int(v) for v in ds] != [int(v) for v in ds]
    it = iter(ds)
    [next(it) for _ in range(3)]
    saved = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "it"))
    rest = [int(v) for v in it]
    later = iter(ds)
    tf.train.Checkpoint(iterator=later).restore(saved)
    assert [int(v) for v in later] == rest
    # A batch past the data is all of it.
    assert [len(b) for b in tf.data.Dataset.range(5).batch(2**62)] == [5]
    # Counts are whole numbers, as TensorFlow takes them: 2.5 is named, not truncated; an
    # integer tensor counts; range's output_type is an integer type.
    for make, what in ((lambda: tf.data.Dataset.range(2.5), "Dataset.range: stop"),
                       (lambda: tf.data.Dataset.range(5).batch(2.5), "batch: batch_size"),
                       (lambda: tf.data.Dataset.range(5).take(1.5), "take: count")):
        with pytest.raises(TypeError, match=what + " must be a whole number, got"):
            make()
    assert [int(v) for v in tf.data.Dataset.range(1, 9, 3, output_type=tf.int64).take(tf.constant(2))] == [1, 4]
    for other in (tf.float32, tf.bool, np.int16):
        with pytest.raises(NotImplementedError, match="Dataset.range.output_type="):
            tf.data.Dataset.range(3, output_type=other)
    assert [int(v) for v in tf.data.Dataset.range(5).filter(lambda v: v.numpy() > 2)] == [3, 4]  # numpy's bool
    with pytest.raises(tf.errors.InvalidArgumentError, match="predicate must return a bool, got None"):
        list(tf.data.Dataset.range(3).filter(lambda v: None))
    # evaluate(steps=) on an endless dataset stops there; what it cannot do is named.
    x, y = _data(64)
    model = _model()
    endless = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    assert np.isfinite(model.evaluate(endless, steps=2, verbose=0)[0])
    with pytest.raises(NotImplementedError, match="evaluate.sample_weight"):
        model.evaluate(x, y, sample_weight=np.ones(64), verbose=0)
    # LearningRateScheduler calls schedule(epoch) where it takes one argument, as Keras does,
    # and names a schedule that returns no number.
    opt = tf.keras.optimizers.SGD(0.1)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=2, verbose=0,
              callbacks=[tf.keras.callbacks.LearningRateScheduler(lambda epoch: 0.5 / (epoch + 1))])
    assert opt.learning_rate == pytest.approx(0.25)
    for returned in (None, "0.1"):
        with pytest.raises(TypeError, match=f"the schedule returned {returned!r} for epoch 0; it must return"):
            model.fit(x, y, verbose=0,
                      callbacks=[tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr, r=returned: r)])
    # A Dataset's batches are its own: a batch_size beside it is named, not ignored.
    for call in (lambda: model.fit(endless, batch_size=8, steps_per_epoch=1, verbose=0),
                 lambda: model.evaluate(endless, batch_size=8, steps=1, verbose=0),
                 lambda: model.predict(endless.take(1), batch_size=8)):
        with pytest.raises(ValueError, match=r"batch_size is for arrays.*dataset.batch\(8\)"):
            call()
    with pytest.raises(ValueError, match="reduce_op must be SUM or MEAN.*'max'"):
        tf.distribute.get_strategy().reduce("max", tf.constant(1.0), axis=None)
    with pytest.raises(ValueError, match="global_batch_size must be a whole number > 0, got -2"):
        tf.nn.compute_average_loss(tf.constant([1.0, 2.0]), global_batch_size=-2)
    # A damaged file's bytes quoted in a message reach Python, written \xNN.
    path = str(tmp_path / "m.keras")
    model.fit(x, y, verbose=0)  # Adam's slots, saved with the model
    model.save(path)
    model.load_weights(path)  # a saved model's optimizer slots are its own, not another model's
    data = bytearray(open(path, "rb").read())
    data[8] = 0xFB
    open(path, "wb").write(bytes(data))
    with pytest.raises(OSError, match=r"m.keras: header is not valid JSON.*\\xfb"):
        tf.keras.models.load_model(path)


def test_history_names_the_first_step_that_was_not_finite():
    x, y = _data()
    model = _model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    assert model.fit(x[:64], y[:64], batch_size=32, verbose=0).non_finite is None
    x = x[:64].copy()
    x[40] = np.nan  # in the second batch
    history = model.fit(x, y[:64], batch_size=32, shuffle=False, verbose=0)
    assert history.non_finite is not None and "epoch 1, batch 2" in history.non_finite, history.non_finite


def test_datasets_keep_their_elements_structure_and_order():
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = np.arange(10)
    pairs = list(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    assert [len(p[1]) for p in pairs] == [4, 4, 2] and isinstance(pairs[0], tuple)
    doubled = tf.data.Dataset.from_tensor_slices(x).map(lambda v: v * 2.0).filter(lambda v: float(v.numpy()[0]) > 5)
    assert [float(v.numpy()[0]) for v in doubled] == [6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0]
    a = [int(v.numpy()) for v in tf.data.Dataset.range(20).shuffle(20, seed=7)]
    b = [int(v.numpy()) for v in tf.data.Dataset.range(20).shuffle(20, seed=7)]
    assert a == b and sorted(a) == list(range(20)) and a != list(range(20))

    def rows():
        for i in range(5):
            yield np.full((3,), i, np.float32), i

    gen = tf.data.Dataset.from_generator(rows, output_signature=(tf.TensorSpec((3,), tf.float32), tf.TensorSpec((), tf.int32)))
    batches = list(gen.batch(2))
    assert [b[1].numpy().tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[0][0].shape == (2, 3)
    assert len(list(gen)) == 5  # a second pass calls the generator again


def _custom_loop(strategy, x, y, global_batch, steps):
    tf.keras.utils.set_random_seed(11)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(x.shape[1],)),
                                     tf.keras.layers.Dense(3)])
        optimizer = tf.keras.optimizers.SGD(0.1)
    losses = train_custom_loop(strategy, model, optimizer, x, y, global_batch, steps)
    return model.get_weights(), losses


def test_two_replicas_running_a_python_step_equal_one_device_on_the_global_batch():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(256, 6)).astype(np.float32)
    y = rng.integers(0, 3, 256)
    one, loss_one = _custom_loop(tf.distribute.OneDeviceStrategy(), x, y, 32, 8)
    two, loss_two = _custom_loop(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), x, y, 32, 8)
    np.testing.assert_allclose(loss_two, loss_one, rtol=1e-5)
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_a_python_exception_in_a_replica_is_raised_as_itself():
    strategy = tf.distribute.MirroredStrategy(2)

    def step(v):
        raise KeyError("replica step failed")

    with pytest.raises(KeyError, match="replica step failed"):
        strategy.run(step, args=(1,))

    # Replica 1 fails while replica 0 waits for it in a sum: replica 1's error is raised,
    # not replica 0's PeerFailure that follows from it.
    with strategy.scope():
        v = tf.Variable([1.0])
        opt = tf.keras.optimizers.SGD(0.1)
    ids = strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)

    def second_fails(i):
        if i == 1:
            raise KeyError("replica 1 failed first")
        opt.apply_gradients([(tf.constant([1.0]), v)])  # sums over the replicas: waits for replica 1

    with pytest.raises(KeyError, match="replica 1 failed first"):
        strategy.run(second_fails, args=(ids,))


def test_python_minus_m_dtrain_is_the_command(python_run):
    from conftest import SOURCE

    code, output = python_run("-m", "dtrain", "summary", str(SOURCE / "examples/configs/seed_small.json"))
    assert code == 0, output
    assert "dense" in output and "Total params" in output


@pytest.mark.parametrize("call", [
    lambda: tf.keras.Sequential([tf.keras.layers.Dense("ten", input_shape=(3,))]),
    lambda: tf.keras.Sequential([tf.keras.layers.Dense(4, activation="swish-ish", input_shape=(3,))]),
    lambda: tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,), bogus=1)]),
    lambda: tf.data.Dataset.from_tensor_slices((np.zeros((3, 2)), np.zeros(4))),
    lambda: _model().fit(*_data(), batch_size=0, verbose=0),
    lambda: _model().fit(*_data(), epochs=-1, verbose=0),
    lambda: tf.Variable(np.zeros((2, 2), np.float32)).assign(np.zeros((3,), np.float32)),
    lambda: tf.reshape(tf.zeros((2, 3)), (4, 2)),
    lambda: tf.matmul(tf.zeros((2, 3)), tf.zeros((2, 3))),
    lambda: tf.keras.losses.SparseCategoricalCrossentropy()(np.array([0, 9]), np.zeros((2, 3), np.float32)),
    lambda: tf.distribute.MirroredStrategy(["/gpu:0"]),
    lambda: tf.distribute.MirroredStrategy(0),
    lambda: tf.keras.optimizers.Adam(learning_rate="fast"),
    lambda: tf.data.Dataset.range(4).batch(0),
    lambda: tf.keras.models.load_model("/no/such/model.safetensors"),
    lambda: tf.train.Checkpoint(model=_model()).restore("/no/such/ckpt.safetensors"),
])
def test_bad_arguments_are_python_errors_not_crashes(call):
    with pytest.raises((ValueError, TypeError, OSError, NotImplementedError)):
        call()


@pytest.mark.parametrize("call", [
    lambda: tf.keras.callbacks.ModelCheckpoint("m.safetensors", save_freq=[3]),
    lambda: tf.keras.callbacks.BackupAndRestore("backup", save_freq="often"),
    lambda: tf.distribute.MirroredStrategy([0, 1]),
    lambda: tf.keras.optimizers.SGD(learning_rate=None),
])
def test_arguments_of_the_wrong_kind_name_themselves(call):
    with pytest.raises((ValueError, TypeError)) as error:
        call()
    assert any(word in str(error.value) for word in ("save_freq", "devices", "learning_rate"))


def test_keras_forms_that_tutorials_use():
    x, y = _data(256)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation=tf.nn.relu, input_shape=(20,)),
                                 tf.keras.layers.Dense(2, activation=tf.keras.activations.softmax)])
    assert model.layers[0].get_config()["activation"] == "relu"
    model.compile(loss="sparse_categorical_crossentropy")  # Keras's default optimizer
    assert model.optimizer.name == "RMSprop"
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(50)
    assert int(dataset.cardinality().numpy()) == 6
    predictions = model.predict(dataset)
    np.testing.assert_allclose(predictions, model.predict(x), rtol=1e-5, atol=1e-6)
    assert tf.constant([1, 2, 3, 4], shape=[2, 2]).shape == (2, 2)
    strategy = tf.distribute.MirroredStrategy(2)
    it = iter(strategy.experimental_distribute_dataset(dataset))
    first = it.get_next()
    assert len(first[0].values) == 2 and first[0].values[0].shape == (25, 20)
    with pytest.raises(TypeError, match="distributed dataset's iterator"):
        tf.train.Checkpoint(iterator=it)
    # Each pass over a distributed dataset is its next epoch too: a custom loop's epochs reshuffle.
    shuffled = strategy.experimental_distribute_dataset(tf.data.Dataset.range(40).shuffle(40, seed=2).batch(8))

    def order():
        return [int(v) for batch in shuffled for part in batch.values for v in part.numpy()]

    first, second = order(), order()
    assert first != second and sorted(first) == sorted(second) == list(range(40))
