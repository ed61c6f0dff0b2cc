"""tf.keras.initializers, by the names Keras's configs use."""


class Initializer:
    def __init__(self, class_name, **config):
        self.class_name = class_name
        self.config = config

    def get_config(self):
        return {"class_name": self.class_name, "config": dict(self.config)}


def GlorotUniform(seed=None):  # noqa: N802 (Keras's class names)
    return Initializer("GlorotUniform", seed=seed)


def HeNormal(seed=None):  # noqa: N802
    return Initializer("HeNormal", seed=seed)


def Zeros():  # noqa: N802
    return Initializer("Zeros")


def Ones():  # noqa: N802
    return Initializer("Ones")
