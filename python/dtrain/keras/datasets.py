"""tf.keras.datasets: Fashion-MNIST from Debian's dataset-fashion-mnist package (read from
$DTRAIN_FASHION_MNIST_DIR when set), nothing downloaded."""
from .. import _dtrain


class fashion_mnist:  # noqa: N801 (Keras's module name)
    @staticmethod
    def load_data():
        """((x_train, y_train), (x_test, y_test)): uint8 images [n, 28, 28], uint8 labels 0..9."""
        return _dtrain.keras._load_fashion_mnist("")
