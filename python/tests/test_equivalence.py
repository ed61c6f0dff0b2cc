"""A model trained from Python equals the same model trained by the dtrain command, bit for
bit: the same Keras JSON builds the same layers from the same seed, and fit runs the same
C++ loop on the same rows."""
import json
import os
import subprocess

import numpy as np

import dtrain as tf


def _command():
    from dtrain._command import COMMAND

    return COMMAND


def _weights(path):
    """Each tensor of a safetensors file, by name, as raw bytes."""
    raw = open(path, "rb").read()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    data = raw[8 + size:]
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def test_python_fit_equals_the_dtrain_command_bit_for_bit(tmp_path):
    rng = np.random.default_rng(2024)
    x = rng.normal(size=(600, 12)).astype(np.float32)
    y = (np.argmax(x[:, :4], axis=1)).astype(np.int64)
    # %.9g gives back every float32 exactly.
    rows = [",".join([f"f{i}" for i in range(12)] + ["label"])]
    rows += [",".join([f"{v:.9g}" for v in r] + [str(label)]) for r, label in zip(x, y)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    layers = [{"class_name": "Dense", "config": {"units": 32, "activation": "relu"}},
              {"class_name": "Dropout", "config": {"rate": 0.1}},
              {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]
    config = {"model": {"input_shape": [12], "layers": layers}, "loss": "sparse_categorical_crossentropy",
              "optimizer": "adam", "metrics": ["accuracy"], "epochs": 3, "batch_size": 32, "seed": 7,
              "data": {"source": "csv", "train": str(tmp_path / "train.csv"), "label_column": "label"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    subprocess.run([_command(), "fit", str(tmp_path / "config.json"), "--threads", "1", "--verbose", "0",
                    "--save-weights", str(tmp_path / "cli.safetensors")],
                   check=True, capture_output=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(7)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(12,)),
                                 tf.keras.layers.Dropout(0.1),
                                 tf.keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    model.save_weights(str(tmp_path / "python.safetensors"))

    cli, python = _weights(tmp_path / "cli.safetensors"), _weights(tmp_path / "python.safetensors")
    assert sorted(cli) == sorted(python) == ["dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"]
    for name in cli:
        assert cli[name] == python[name], name
