"""The data the seeds' examples use without defining it, for the files here that complete
them: Fashion-MNIST from Debian's package, its first 10000 training images and all 10000
test images scaled to [0, 1], with one-hot labels (the seeds' categorical losses)."""
import dtrain as tf


def fashion_mnist(flat=False):
    """(x_train, y_train, x_test, y_test); images [n, 28, 28], or [n, 784] when flat."""
    (x_all, y_all), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    shape = (-1, 784) if flat else (-1, 28, 28)
    return ((x_all[:10000] / 255.0).reshape(shape), tf.keras.utils.to_categorical(y_all[:10000], 10),
            (x_test / 255.0).reshape(shape), tf.keras.utils.to_categorical(y_test, 10))
