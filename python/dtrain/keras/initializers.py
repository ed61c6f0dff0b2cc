"""tf.keras.initializers, by the names Keras's configs use. A layer's config keeps them by
class name (the built-in layers draw from dtrain's generators); add_weight in a layer of
your own takes them too, and Constant, and the random ones with other than Keras's default
spread (drawn with numpy, from their seed)."""
import numpy as np


class Initializer:
    def __init__(self, class_name, **config):
        self.class_name = class_name
        self.config = config

    def get_config(self):
        return {"class_name": self.class_name, "config": dict(self.config)}

    def __repr__(self):
        return f"{self.class_name}({', '.join(f'{k}={v!r}' for k, v in self.config.items())})"


class _Drawn(Initializer):
    """A random initializer away from Keras's defaults: values from numpy, seeded."""

    def __call__(self, shape, dtype=None):
        del dtype
        rng = np.random.default_rng(self.config.get("seed"))
        c = self.config
        if self.class_name == "RandomUniform":
            return rng.uniform(c["minval"], c["maxval"], size=shape).astype(np.float32)
        values = rng.standard_normal(size=shape)
        if self.class_name == "TruncatedNormal":
            bad = np.abs(values) > 2
            while bad.any():
                values[bad] = rng.standard_normal(size=int(bad.sum()))
                bad = np.abs(values) > 2
        return (c["mean"] + c["stddev"] * values).astype(np.float32)


def GlorotUniform(seed=None):  # noqa: N802 (Keras's class names)
    return Initializer("GlorotUniform", seed=seed)


def GlorotNormal(seed=None):  # noqa: N802
    return Initializer("GlorotNormal", seed=seed)


def HeNormal(seed=None):  # noqa: N802
    return Initializer("HeNormal", seed=seed)


def HeUniform(seed=None):  # noqa: N802
    return Initializer("HeUniform", seed=seed)


def Zeros():  # noqa: N802
    return Initializer("Zeros")


def Ones():  # noqa: N802
    return Initializer("Ones")


def RandomNormal(mean=0.0, stddev=0.05, seed=None):  # noqa: N802
    if mean == 0.0 and stddev == 0.05:
        return Initializer("RandomNormal", mean=0.0, stddev=0.05, seed=seed)
    return _Drawn("RandomNormal", mean=float(mean), stddev=float(stddev), seed=seed)


def TruncatedNormal(mean=0.0, stddev=0.05, seed=None):  # noqa: N802
    if mean == 0.0 and stddev == 0.05:
        return Initializer("TruncatedNormal", mean=0.0, stddev=0.05, seed=seed)
    return _Drawn("TruncatedNormal", mean=float(mean), stddev=float(stddev), seed=seed)


def RandomUniform(minval=-0.05, maxval=0.05, seed=None):  # noqa: N802
    if minval == -0.05 and maxval == 0.05:
        return Initializer("RandomUniform", minval=-0.05, maxval=0.05, seed=seed)
    return _Drawn("RandomUniform", minval=float(minval), maxval=float(maxval), seed=seed)


class Constant(Initializer):
    def __init__(self, value=0.0):
        super().__init__("Constant", value=value)

    def __call__(self, shape, dtype=None):
        del dtype
        return np.full(shape, self.config["value"], dtype=np.float32)


zeros = Zeros
ones = Ones
