"""Convolutional models from Python: Keras's Conv2D, pooling and batch norm layers on
Fashion-MNIST's images, trained by fit."""
import numpy as np

import dtrain as tf


def test_a_small_convnet_learns_fashion_mnist():
    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    assert x_train.shape == (60000, 28, 28) and x_train.dtype == np.uint8
    x = (x_train[:3000] / 255.0).reshape(-1, 28, 28, 1)
    tf.keras.utils.set_random_seed(2)
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, 3, activation="relu", padding="same", input_shape=(28, 28, 1)),
        tf.keras.layers.BatchNormalization(momentum=0.9),  # moving statistics settle within 3 short epochs
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y_train[:3000], epochs=3, batch_size=64, verbose=0)
    loss, accuracy = model.evaluate((x_test[:2000] / 255.0).reshape(-1, 28, 28, 1), y_test[:2000], verbose=0)
    assert accuracy > 0.6  # chance is 0.1; this net reaches 0.67 in three epochs here
    assert model.output_shape == (None, 10)
