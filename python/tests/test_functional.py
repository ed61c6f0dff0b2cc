"""The functional API from Python: Input, layers called on tensors, Model(inputs, outputs),
trained with fit, equal to the same graph in the dtrain command's JSON form."""
import numpy as np
import pytest

import dtrain as tf


def test_a_functional_model_with_a_shared_layer_and_a_skip_trains():
    tf.keras.utils.set_random_seed(1)
    inputs = tf.keras.Input(shape=(12,))
    hidden = tf.keras.layers.Dense(12, activation="relu")
    x = hidden(inputs)
    skip = tf.keras.layers.Add()([x, inputs])
    outputs = tf.keras.layers.Dense(3, activation="softmax")(skip)
    model = tf.keras.Model(inputs=inputs, outputs=outputs)
    assert model.built and [l.name for l in model.layers][-1].startswith("dense")
    rng = np.random.default_rng(0)
    x_train = rng.normal(size=(1024, 12)).astype(np.float32)
    y_train = np.argmax(x_train[:, :3], axis=1)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, y_train, epochs=8, batch_size=32, verbose=0)
    assert history.history["accuracy"][-1] > 0.85
    assert model.predict(x_train[:5]).shape == (5, 3)
    assert hidden.built and len(hidden.weights) == 2


def test_the_same_graph_as_a_sequential_gives_the_same_weights():
    tf.keras.utils.set_random_seed(4)
    inputs = tf.keras.Input(shape=(6,))
    outputs = tf.keras.layers.Dense(2)(tf.keras.layers.Dense(8, activation="relu")(inputs))
    functional = tf.keras.Model(inputs, outputs)
    tf.keras.utils.set_random_seed(4)
    sequential = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)),
                                      tf.keras.layers.Dense(2)])
    for a, b in zip(functional.get_weights(), sequential.get_weights()):
        assert a.tobytes() == b.tobytes()
    x = np.ones((3, 6), np.float32)
    np.testing.assert_array_equal(functional(x).numpy(), sequential(x).numpy())


def test_a_graph_that_reads_an_input_it_was_not_given_is_refused():
    a, b = tf.keras.Input(shape=(4,)), tf.keras.Input(shape=(4,))
    out = tf.keras.layers.Add()([a, b])
    with pytest.raises(ValueError, match="not among the inputs"):
        tf.keras.Model(inputs=a, outputs=out)
    with pytest.raises(TypeError, match="tf.keras.Input"):
        tf.keras.Model(inputs=np.zeros(3), outputs=out)
