"""Fashion-MNIST as TensorFlow keeps data sets: sharded, GZIP-compressed TFRecord files of
tf.train.Example (the image's 784 bytes and an int64 label), trained as the IDX files are,
under one device, MirroredStrategy, MultiWorkerMirroredStrategy (two processes, the shards
divided by file) and ParameterServerStrategy (the dtrain command, "source": "tfrecord").
Prints each run's test accuracy beside the IDX run's, and the two workers' input wait as a
share of their epochs.

    python3 bench/tfrecord_fashion_mnist.py [--epochs 3] [--shards 8] [--compression GZIP|none]
                                            [--only one,mirrored,workers,ps]

Run from the build tree's python path (PYTHONPATH=build/release/python); the dtrain command
is found beside the package.
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import dtrain as tf

SPEC = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
BATCH = 128


COMPRESSION = "GZIP"


def write_shards(directory, x, y, shards, prefix):
    for s in range(shards):
        with tf.io.TFRecordWriter(os.path.join(directory, f"{prefix}-{s:02d}.tfrecord.gz"), COMPRESSION) as writer:
            for i in range(s, len(x), shards):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[i].tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
                })).SerializeToString())


def parse(batch):
    features = tf.io.parse_example(batch, SPEC)
    return tf.io.decode_raw(features["image"], tf.uint8), features["label"]


def tfrecord_input(directory, seed):
    files = tf.data.Dataset.list_files(os.path.join(directory, "train-*.tfrecord.gz"), shuffle=False)
    records = files.interleave(lambda f: tf.data.TFRecordDataset(f, COMPRESSION), cycle_length=4,
                               num_parallel_calls=tf.data.AUTOTUNE)
    return records.shuffle(10000, seed=seed).batch(BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE) \
        .prefetch(tf.data.AUTOTUNE)


def idx_input(x, y, seed):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10000, seed=seed).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def model():
    tf.keras.utils.set_random_seed(0)
    m = tf.keras.Sequential([tf.keras.Input(shape=(784,)), tf.keras.layers.Rescaling(1 / 255),
                             tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(10)])
    m.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


def train(strategy, dataset, epochs, x_test, y_test):
    with strategy.scope() if strategy else contextlib.nullcontext():
        m = model()
    history = m.fit(dataset, epochs=epochs, verbose=0)
    accuracy = m.evaluate(x_test, y_test, batch_size=1000, verbose=0, return_dict=True)["accuracy"]
    wait = sum(history.input_wait_seconds) / max(sum(history.epoch_seconds), 1e-9)
    return accuracy, wait


def worker_main(args):
    """One worker of the two-process job (started by `dtrain launch` with TF_CONFIG)."""
    (_, _), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    accuracy, wait = train(strategy, tfrecord_input(args.dir, 1), args.epochs, x_test.reshape(-1, 784), y_test)
    print(json.dumps({"accuracy": accuracy, "input_wait": wait}), flush=True)


def dtrain_command():
    build = os.path.dirname(os.path.dirname(os.path.abspath(tf.__file__)))
    for candidate in (os.path.join(build, "..", "dtrain"), os.path.join(build, "dtrain")):
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    return "dtrain"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--only", default="one,mirrored,workers,ps")
    parser.add_argument("--compression", default="GZIP", choices=["GZIP", "none"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global COMPRESSION
    COMPRESSION = "" if args.compression == "none" else args.compression
    if args.worker:
        return worker_main(args)
    runs = args.only.split(",")
    (x, y), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    x, x_test = x.reshape(-1, 784), x_test.reshape(-1, 784)
    with tempfile.TemporaryDirectory() as directory:
        start = time.time()
        write_shards(directory, x, y, args.shards, "train")
        write_shards(directory, x_test, y_test, 2, "test")
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        print(f"wrote {args.shards} + 2 shards ({args.compression}, {size / 1e6:.1f} MB) in {time.time() - start:.1f} s")
        rows = []
        if "one" in runs:
            rows.append(("one device", train(None, idx_input(x, y, 1), args.epochs, x_test, y_test),
                         train(None, tfrecord_input(directory, 1), args.epochs, x_test, y_test)))
        if "mirrored" in runs:
            rows.append(("MirroredStrategy(2)",
                         train(tf.distribute.MirroredStrategy(2), idx_input(x, y, 1), args.epochs, x_test, y_test),
                         train(tf.distribute.MirroredStrategy(2), tfrecord_input(directory, 1), args.epochs, x_test,
                               y_test)))
        if "workers" in runs:
            out = subprocess.run([dtrain_command(), "launch", "--workers", "2", "--", sys.executable, __file__, "--worker",
                                  "--dir", directory, "--epochs", str(args.epochs), "--compression", args.compression],
                                 capture_output=True, text=True,
                                 timeout=1800)
            results = [json.loads(m) for m in re.findall(r"\{\"accuracy\".*\}", out.stdout)]
            if out.returncode != 0 or len(results) != 2:
                print(out.stdout[-3000:], out.stderr[-3000:])
                raise SystemExit("the two-worker run failed")
            idx_one = rows[0][1] if rows else train(None, idx_input(x, y, 1), args.epochs, x_test, y_test)
            rows.append(("MultiWorkerMirrored, 2 workers, by file", idx_one,
                         (results[0]["accuracy"], max(r["input_wait"] for r in results))))
        if "ps" in runs:
            config = {"model": {"input_shape": [784], "layers": [
                {"class_name": "Rescaling", "config": {"scale": 1 / 255}},
                {"class_name": "Dense", "config": {"units": 256, "activation": "relu"}},
                {"class_name": "Dense", "config": {"units": 128, "activation": "relu"}},
                {"class_name": "Dense", "config": {"units": 10}}]},
                "loss": {"name": "sparse_categorical_crossentropy", "from_logits": True},
                "optimizer": {"name": "adam", "learning_rate": 0.001}, "metrics": ["accuracy"],
                "epochs": args.epochs, "batch_size": BATCH, "seed": 0}
            accuracies = []
            layers = config["model"]["layers"]
            for source in ("idx", "tfrecord"):
                if source == "idx":
                    # The fashion_mnist source's pixels are scaled to [0, 1] already.
                    config["model"]["layers"] = layers[1:]
                    config["data"] = {"source": "fashion_mnist"}
                else:
                    config["model"]["layers"] = layers
                    config["data"] = {"source": "tfrecord", "train": os.path.join(directory, "train-*.tfrecord.gz"),
                                      "test": os.path.join(directory, "test-*.tfrecord.gz"), "compression": COMPRESSION,
                                      "features": {"image": {"dtype": "string", "decode_raw": "uint8"},
                                                   "label": {"dtype": "int64"}}, "x": "image", "y": "label"}
                path = os.path.join(directory, f"ps_{source}.json")
                with open(path, "w") as f:
                    json.dump(config, f)
                out = subprocess.run([dtrain_command(), "launch", "--workers", "2", "--ps", "1", "fit", path],
                                     capture_output=True, text=True, timeout=1800)
                found = re.findall(r"test.*?accuracy[ :=]+([0-9.]+)", out.stdout)
                if out.returncode != 0 or not found:
                    print(out.stdout[-3000:], out.stderr[-3000:])
                    raise SystemExit(f"the parameter-server run on {source} failed")
                accuracies.append(float(found[-1]))
            rows.append(("ParameterServer, 2 workers + 1 ps (dtrain fit)", (accuracies[0], None), (accuracies[1], None)))
        print(f"\n{args.epochs} epochs, batch {BATCH}, the same MLP and seed; test accuracy on the 10,000 test images")
        print(f"{'run':<48} {'IDX':>8} {'TFRecord':>9} {'input wait':>11}")
        for name, (idx_acc, _), (tfr_acc, wait) in rows:
            shown = "" if wait is None else f"{100 * wait:.1f}%"
            print(f"{name:<48} {idx_acc:8.4f} {tfr_acc:9.4f} {shown:>11}")


if __name__ == "__main__":
    main()
