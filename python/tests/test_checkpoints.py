"""tf.train.Checkpoint and CheckpointManager from Python: a resumed custom loop is the same
run (weights bit for bit), a damaged file is named and the manager falls back, and a
checkpoint that does not fit the model changes nothing."""
import numpy as np
import pytest

import dtrain as tf


def _job(seed):
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(6,)),
                                 tf.keras.layers.Dropout(0.3),
                                 tf.keras.layers.Dense(3)])
    optimizer = tf.keras.optimizers.Adam(0.01)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 6)).astype(np.float32)
    y = rng.integers(0, 3, 200)
    iterator = iter(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(200, seed=4).batch(16).repeat())
    return model, optimizer, iterator


def _train(model, optimizer, iterator, steps):
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for _ in range(steps):
        inputs, labels = next(iterator)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def test_a_resumed_loop_is_the_same_run(tmp_path):
    model, optimizer, iterator = _job(5)
    _train(model, optimizer, iterator, 20)
    uninterrupted = model.get_weights()

    model, optimizer, iterator = _job(5)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator),
                                         tmp_path, max_to_keep=2)
    _train(model, optimizer, iterator, 10)
    saved = manager.save()
    assert manager.latest_checkpoint == saved and tf.train.latest_checkpoint(str(tmp_path)) == saved

    # A new process would start from other weights, Adam's moments at zero and the data's start.
    model, optimizer, iterator = _job(99)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator),
                                         tmp_path, max_to_keep=2)
    assert manager.restore_or_initialize() == saved
    assert optimizer.iterations == 10
    _train(model, optimizer, iterator, 10)
    for a, b in zip(uninterrupted, model.get_weights()):
        assert a.tobytes() == b.tobytes()


def test_a_damaged_checkpoint_is_named_and_the_manager_falls_back(tmp_path):
    model, optimizer, iterator = _job(5)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=3)
    _train(model, optimizer, iterator, 2)
    first = manager.save()
    _train(model, optimizer, iterator, 2)
    second = manager.save()
    raw = bytearray(open(second, "rb").read())
    raw[-5] ^= 0x10  # one bit of the last tensor's data
    open(second, "wb").write(bytes(raw))
    with pytest.raises(OSError, match=second.split("/")[-1]):
        checkpoint.restore(second)
    assert manager.restore_or_initialize() == first
    assert optimizer.iterations == 2


def test_a_checkpoint_of_another_model_changes_nothing(tmp_path):
    model, optimizer, _ = _job(5)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "wide.safetensors"))
    narrow = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)),
                                  tf.keras.layers.Dropout(0.3), tf.keras.layers.Dense(3)])
    before = narrow.get_weights()
    with pytest.raises(OSError, match=r"tensor .model/dense/kernel. is float32 \[6, 16\].*needs float32 \[6, 8\]"):
        tf.train.Checkpoint(model=narrow).restore(path)
    for a, b in zip(before, narrow.get_weights()):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(TypeError, match="'step' is a int"):
        tf.train.Checkpoint(step=3)
