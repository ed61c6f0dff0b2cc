"""TensorFlow's and Keras's own forms: the custom-loop tutorial under MirroredStrategy with
its checkpoint restore, layers and models of your own (subclassing), regularizers and
constraints, callable metrics, RMSprop and Adagrad, Keras's JSON and .keras files."""
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import dtrain as tf
from wire import fields
from conftest import HERE, SOURCE

KERAS_FILES = SOURCE / "tests" / "model" / "keras_files"


def _data(n=256, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x[:, 0] - 0.5 * x[:, 1] > 0).astype(np.int32)
    return x, y


def test_the_custom_loop_tutorial_trains_saves_into_a_new_folder_and_restores(python_run, tmp_path):
    code, output = python_run(HERE / "tutorials" / "custom_loop_mirrored.py", str(tmp_path / "new" / "run"),
                              timeout=300)
    assert code == 0, output[-3000:]
    assert "Number of devices: 2" in output
    final = float(output.split("final test accuracy ")[1].split()[0])
    restored = float(output.split("without strategy: ")[1].split()[0])
    assert final >= 0.65, output[-2000:]
    # The restored model, without the strategy, scores what the trained one scored.
    assert restored == pytest.approx(100 * final, abs=1e-6), output[-2000:]
    assert sorted(p.name for p in (tmp_path / "new" / "run" / "training_checkpoints").iterdir()) == \
        ["ckpt-1.safetensors", "ckpt-2.safetensors"]


class Linear(tf.keras.layers.Layer):
    """The Keras guide's Linear layer."""

    def __init__(self, units=32, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="random_normal", trainable=True)
        self.b = self.add_weight(shape=(self.units,), initializer="zeros", trainable=True)

    def call(self, inputs):
        return tf.matmul(inputs, self.w) + self.b


class Classifier(tf.keras.Model):
    def __init__(self, dropout=0.2, **kwargs):
        super().__init__(**kwargs)
        self.hidden = tf.keras.layers.Dense(16, activation="relu",
                                            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))
        self.dropout = tf.keras.layers.Dropout(dropout, seed=4)
        self.out = Linear(2)

    def call(self, inputs, training=False):
        return self.out(self.dropout(self.hidden(inputs), training=training))


def _classifier(seed=3, dropout=0.2):
    tf.keras.utils.set_random_seed(seed)
    model = Classifier(dropout)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def test_a_subclassed_model_fits_evaluates_and_restores_from_a_checkpoint(tmp_path):
    x, y = _data(512)
    model = _classifier()
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    assert history.history["accuracy"][-1] > 0.85
    assert [v.name for v in model.trainable_variables] == [
        model.hidden.name + "/kernel", model.hidden.name + "/bias", model.out.name + "/variable",
        model.out.name + "/variable_1"]
    assert model.count_params() == 8 * 16 + 16 + 16 * 2 + 2
    assert len(model.layers) == 3
    loss, accuracy = model.evaluate(x, y, verbose=0)
    assert accuracy > 0.85
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "sub" / "ckpt"))
    fresh = _classifier(seed=11)
    assert not np.allclose(fresh(x[:4]).numpy(), model(x[:4]).numpy())
    tf.train.Checkpoint(model=fresh).restore(path)
    np.testing.assert_array_equal(fresh(x).numpy(), model(x).numpy())
    with pytest.raises(NotImplementedError, match="written in Python"):
        model.to_json()


def test_a_subclassed_model_under_mirrored_strategy_matches_one_device():
    x, y = _data(384)

    def train(strategy, dropout=0.0):
        with strategy.scope():
            model = _classifier(dropout=dropout)
        history = model.fit(x, y, batch_size=48, epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), history.history["loss"]

    one, one_loss = train(tf.distribute.OneDeviceStrategy("/cpu:0"))
    two, two_loss = train(tf.distribute.MirroredStrategy(3))
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two_loss, one_loss, rtol=1e-5)
    # With dropout each replica draws its own masks (as in TensorFlow), and still learns.
    weights, losses = train(tf.distribute.MirroredStrategy(2), dropout=0.2)
    assert losses[-1] < losses[0]


def test_a_subclassed_layer_in_a_custom_loop_gets_gradients_and_its_penalty():
    class Scaled(tf.keras.layers.Layer):
        def build(self, input_shape):
            self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones",
                                         regularizer=tf.keras.regularizers.L2(0.5),
                                         constraint=tf.keras.constraints.NonNeg())

        def call(self, inputs):
            return inputs * self.scale

    layer = Scaled()
    model = tf.keras.Sequential([layer, tf.keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)])
    x = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    with tf.GradientTape() as tape:
        out = model(x)
        penalty = tf.add_n(model.losses)
        loss = tf.reduce_sum(out) + penalty
    assert float(penalty) == pytest.approx(0.5 * 2)
    scale = layer.variables[0]
    grads = tape.gradient(loss, model.trainable_variables)
    # d/dscale: the column sums of x (through the ones kernel) plus 2 * 0.5 * scale.
    np.testing.assert_allclose(grads[0].numpy(), [4.0 + 1.0, 1.0 + 1.0])
    tf.keras.optimizers.SGD(1.0).apply_gradients(zip(grads, model.trainable_variables))
    np.testing.assert_allclose(scale.numpy(), [0.0, 0.0])  # 1 - 5 and 1 - 2, then NonNeg
    with pytest.raises(ValueError, match=r"layer 'broken' \(Broken\) call: ZeroDivisionError: division by zero$"):
        class Broken(tf.keras.layers.Layer):
            def call(self, inputs):
                return inputs / 0 if False else 1 / 0

        tf.keras.Sequential([Broken()])(x)


def test_regularizers_and_constraints_from_python_layers():
    x, y = _data(256)
    tf.keras.utils.set_random_seed(5)
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(8, activation="relu", input_shape=(8,),
                              kernel_regularizer=tf.keras.regularizers.l1_l2(l1=1e-3, l2=1e-2),
                              kernel_constraint=tf.keras.constraints.MaxNorm(0.5),
                              activity_regularizer="l2"),
        tf.keras.layers.Dense(2, bias_regularizer=tf.keras.regularizers.L2(0.1),
                              bias_constraint=tf.keras.constraints.UnitNorm())])
    kernel = model.layers[0].get_weights()[0]
    losses = model.losses
    assert len(losses) == 2  # the weights' penalties; no call yet
    expected = 1e-3 * np.abs(kernel).sum() + 1e-2 * np.square(kernel).sum()
    assert float(losses[0]) == pytest.approx(expected, rel=1e-5)
    assert float(tf.keras.regularizers.l1_l2(l1=1e-3, l2=1e-2)(kernel)) == pytest.approx(expected, rel=1e-5)
    config = json.loads(model.to_json())["config"]["layers"][0]["config"]
    assert config["kernel_regularizer"] == {"class_name": "L1L2", "config": {"l1": 0.001, "l2": 0.01}}
    assert config["kernel_constraint"]["class_name"] == "MaxNorm"
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    norms = np.sqrt(np.square(model.layers[0].get_weights()[0]).sum(axis=0))
    assert norms.max() <= 0.5 + 1e-6
    bias = model.layers[1].get_weights()[1]
    assert np.sqrt(np.square(bias).sum()) == pytest.approx(1.0, abs=1e-5)
    # fit's loss is the data loss plus the penalties: evaluate says so too.
    plain = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x))
    penalties = sum(float(t) for t in model.losses)
    assert model.evaluate(x, y, batch_size=256, verbose=0) == pytest.approx(float(plain) + penalties, rel=1e-5)
    with pytest.raises(ValueError, match="regularizer 'l3'"):
        tf.keras.layers.Dense(2, kernel_regularizer=tf.keras.regularizers.get("l3"))


def test_metrics_are_callable_and_the_ops_tutorials_use_exist(tmp_path):
    accuracy = tf.keras.metrics.SparseCategoricalAccuracy()
    assert accuracy([1, 0], np.array([[0.2, 0.8], [0.3, 0.7]], np.float32)) == pytest.approx(0.5)
    assert accuracy([1], np.array([[0.1, 0.9]], np.float32)) == pytest.approx(2 / 3)
    mean = tf.keras.metrics.Mean()
    assert mean([1.0, 3.0]) == pytest.approx(2.0)
    total = tf.add_n([tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0]), np.array([1.0, 1.0], np.float32)])
    np.testing.assert_allclose(total.numpy(), [5.0, 7.0])
    assert f"{tf.constant(2.0) / 3:.3f}" == "0.667"
    with pytest.raises(ValueError, match="add_n"):
        tf.add_n([tf.constant([1.0]), tf.constant([1.0, 2.0])])
    strategy = tf.distribute.MirroredStrategy(2)
    scaled = strategy.run(lambda: tf.nn.scale_regularization_loss(tf.constant(4.0)))
    assert [float(v) for v in scaled.values] == [2.0, 2.0]
    assert float(tf.nn.l2_loss(tf.constant([3.0, 4.0]))) == pytest.approx(12.5)
    # Checkpoint.save and write make the folders they write into, as TensorFlow does.
    v = tf.Variable([1.0, 2.0])
    assert Path(tf.train.Checkpoint(v=v).write(str(tmp_path / "a" / "b" / "ckpt"))).exists()


def test_rmsprop_and_adagrad_follow_keras():
    w = tf.Variable([1.0, -2.0])
    opt = tf.keras.optimizers.RMSprop(learning_rate=0.01, rho=0.9, momentum=0.5)
    expected, v, m = np.array([1.0, -2.0]), np.zeros(2), np.zeros(2)
    for g in ([0.5, -1.0], [0.25, 2.0]):
        opt.apply_gradients([(tf.constant(g), w)])
        g = np.array(g)
        v = 0.9 * v + 0.1 * g * g
        m = 0.5 * m + 0.01 * g / np.sqrt(v + 1e-7)
        expected -= m
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5)
    w = tf.Variable([1.0])
    opt = tf.keras.optimizers.Adagrad(learning_rate=0.1)
    opt.apply_gradients([(tf.constant([2.0]), w)])
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.1 * 2 / np.sqrt(0.1 + 4 + 1e-7)], rtol=1e-6)
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
    model.compile(loss="mse")
    assert model.optimizer.name == "RMSprop"
    adam = tf.keras.optimizers.get({"module": "keras.optimizers", "class_name": "Adam", "registered_name": None,
                                    "config": {"name": "adam", "learning_rate": 0.0010000000474974513,
                                               "weight_decay": None, "clipnorm": None, "global_clipnorm": None,
                                               "clipvalue": None, "use_ema": False, "ema_momentum": 0.99,
                                               "ema_overwrite_frequency": None, "loss_scale_factor": None,
                                               "gradient_accumulation_steps": None, "beta_1": 0.9, "beta_2": 0.999,
                                               "epsilon": 1e-07, "amsgrad": False}})
    assert adam.name == "Adam"


@pytest.mark.parametrize("name, rows", [("tf_keras_2_4_sequential.json", (2, 32)),
                                        ("tf_keras_2_11_image_layers.json", (2, 8, 8, 1)),
                                        ("keras_3_3_functional.json", (2, 10)),
                                        ("keras_3_15_sequential.json", (2, 3))])
def test_keras_written_json_loads(name, rows):
    model = tf.keras.models.model_from_json((KERAS_FILES / name).read_text())
    assert model(np.ones(rows, np.float32)).shape[0] == 2


def _keras_archive(path, config, weights):
    """A .keras archive as Keras 3 writes one: config.json, metadata.json and
    model.weights.h5 with each layer's arrays at layers/<name>/vars/<index>."""
    import h5py

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h5:
        h5.create_group("vars")
        for layer, arrays in weights.items():
            group = h5.create_group(f"layers/{layer}/vars")
            for i, a in enumerate(arrays):
                group.create_dataset(str(i), data=a)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.5.0", "date_saved": "2024-08-12@10:00:00"}))
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", buffer.getvalue())


def test_a_keras_archive_loads_with_its_weights_and_compile_config(tmp_path):
    pytest.importorskip("h5py")
    config = json.loads((KERAS_FILES / "keras_3_5_sequential.json").read_text())
    rng = np.random.default_rng(1)
    weights = {"conv2d": [rng.normal(size=(3, 3, 2, 4)).astype(np.float32)],
               "batch_normalization": [np.full(4, 1.5, np.float32), np.full(4, 0.1, np.float32),
                                       np.full(4, 0.2, np.float32), np.full(4, 2.0, np.float32)],
               "layer_normalization": [np.ones(16, np.float32), np.zeros(16, np.float32)],
               "dense": [rng.normal(size=(16, 5)).astype(np.float32), np.arange(5, dtype=np.float32)]}
    _keras_archive(tmp_path / "model.keras", config, weights)
    model = tf.keras.models.load_model(str(tmp_path / "model.keras"))
    np.testing.assert_array_equal(model.layers[0].get_weights()[0], weights["conv2d"][0])
    np.testing.assert_array_equal(model.layers[-1].get_weights()[1], np.arange(5))
    assert model.optimizer.name == "Adam"
    model.fit(np.zeros((4, 8, 8, 2), np.float32), np.array([0, 1, 2, 3]), verbose=0)
    weights["dense"] = weights["dense"][:1]
    _keras_archive(tmp_path / "short.keras", config, weights)
    with pytest.raises(ValueError, match="1 arrays for layer 'dense', which has 2 weights"):
        tf.keras.models.load_model(str(tmp_path / "short.keras"))


def test_the_multi_worker_keras_tutorial_resumes_after_a_preempted_worker(tmp_path):
    import sys

    from conftest import run_python

    script = HERE / "tutorials" / "multi_worker_keras.py"
    backup = tmp_path / "backup"
    launch = ("-m", "dtrain", "launch", "--workers", "2", "--timeout", "150", "--", sys.executable, str(script),
              str(backup))
    code, output = run_python(*launch, env={"PREEMPT_WORKER_1_AFTER_EPOCH": "0"}, timeout=200)
    assert code != 0 and "worker:1 exited with code 3" in output, output[-3000:]
    assert (backup / "backup-20.safetensors").exists(), output[-3000:]
    code, output = run_python(*launch, timeout=200)
    assert code == 0, output[-3000:]
    assert "resuming from" in output and "(20 training batches done)" in output, output[-3000:]
    # Both workers train the two epochs left, and end on the same figures.
    lines = sorted(line.split("] ", 1)[1] for line in output.splitlines() if "epochs 2 accuracy" in line)
    assert len(lines) == 2 and lines[0].split("epochs")[1] == lines[1].split("epochs")[1], output[-3000:]


def _tags(path):
    """The (tag, step) pairs of an event file's summaries, every record's CRCs checked."""
    from dtrain import _dtrain

    found = []
    for record in _dtrain.tensorboard.read_records(str(path))[1:]:
        event = dict(fields(record))
        for field, value in fields(event[5]):
            if field == 1:
                found.append((dict(fields(value))[1].decode(), event.get(2, 0)))
    return found


def test_the_tensorboard_callback_writes_event_files_tensorboard_reads(tmp_path):
    x, y = _data(320)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    board = tf.keras.callbacks.TensorBoard(log_dir=str(tmp_path / "logs"), histogram_freq=1, update_freq=4,
                                           profile_batch=(1, 3), write_steps_per_second=True)
    model.fit(x, y, batch_size=32, epochs=2, validation_split=0.2, callbacks=[board], verbose=0)
    train = sorted((tmp_path / "logs" / "train").glob("events.out.tfevents.*"))
    validation = sorted((tmp_path / "logs" / "validation").glob("events.out.tfevents.*"))
    assert len(train) == 1 and len(validation) == 1
    tags = _tags(train[0])
    assert [s for t, s in tags if t == "epoch_loss"] == [0, 1]
    assert [s for t, s in tags if t == "batch_loss"] == [4, 8, 12, 16]  # 8 batches an epoch
    assert [s for t, s in tags if t == "dense/kernel/histogram"] == [0, 1]
    assert ("run_config", 0) in tags and ("epoch_steps_per_second", 1) in tags
    assert [s for t, s in _tags(validation[0]) if t == "epoch_accuracy"] == [0, 1]
    assert len(list((tmp_path / "logs" / "train" / "plugins" / "profile").glob("*/dtrain.trace.json.gz"))) == 1
    with pytest.raises(ValueError, match="update_freq"):
        tf.keras.callbacks.TensorBoard(update_freq="sometimes")
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        return  # TensorBoard itself reads them in scripts/gpu-check.sh, on a machine that has it
    acc = event_accumulator.EventAccumulator(str(tmp_path / "logs" / "train"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("epoch_loss")] == [0, 1]
