#!/usr/bin/python3
"""dtrain from Python, timed: model.fit on the seeds' large MLP, and the seeds' custom loop
(GradientTape + strategy.run) on their small and large MLPs. Prints one JSON line.

  PYTHONPATH=build/release/python /usr/bin/python3 bench/python_loops.py fit --threads 2
  PYTHONPATH=build/release/python /usr/bin/python3 bench/python_loops.py loop --model seed_large --threads 2

fit: the config examples/configs/seed_large.json describes (10000 random rows, batch 64,
Adam), samples/s as the median epoch after the first, as `dtrain fit --summary` reports it.
loop: the seeds' loop under MultiWorkerMirroredStrategy without TF_CONFIG (one worker, as
their examples run on one machine), each step's batch from a batched Dataset, 20 untimed
steps then 200 timed, as bench/peers/pytorch_train.py times PyTorch's eager loop. With
--replicas N: the same step on N MirroredStrategy replicas (a distributed dataset of N
times the batch, the loss divided by the global batch), for what the GIL costs them.
"""
import argparse
import json
import statistics
import time

import numpy as np

import dtrain as tf

SIZES = {"seed_small": (1000, [100, 64, 10], 32), "seed_large": (10000, [1024, 1024, 1024, 10], 64)}


def model_of(sizes):
    layers = [tf.keras.layers.Dense(sizes[1], activation="relu", input_shape=(sizes[0],))]
    layers += [tf.keras.layers.Dense(n, activation="relu") for n in sizes[2:-1]]
    layers.append(tf.keras.layers.Dense(sizes[-1], activation="softmax"))
    return tf.keras.Sequential(layers)


def data(model):
    n, sizes, batch = SIZES[model]
    return (tf.random.normal((n, sizes[0])).numpy(),
            tf.random.uniform((n,), minval=0, maxval=10, dtype=tf.int32).numpy(), sizes, batch)


def run_fit(args):
    x, y, sizes, batch = data("seed_large")
    model = model_of(sizes)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=args.epochs, batch_size=batch, verbose=0)
    steady = history.samples_per_second[1:] or history.samples_per_second
    return {"samples_per_second": statistics.median(steady)}


def run_loop(args):
    x, y, sizes, batch = data(args.model)
    if args.replicas > 1:
        # Several replicas: the global batch split over them, each loss divided by it.
        strategy = tf.distribute.MirroredStrategy(args.replicas)
        batch *= args.replicas
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()
    with strategy.scope():
        model = model_of(sizes)
        optimizer = tf.keras.optimizers.Adam()
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
            reduction="none" if args.replicas > 1 else "sum_over_batch_size")

        @tf.function
        def train_step(inputs, labels):
            with tf.GradientTape() as tape:
                logits = model(inputs)
                loss = loss_fn(labels, logits)
                if args.replicas > 1:
                    loss = tf.nn.compute_average_loss(loss, global_batch_size=batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        if args.replicas > 1:
            dataset = strategy.experimental_distribute_dataset(dataset)
        batches = iter(dataset)
        for _ in range(args.warmup):
            inputs, labels = next(batches)
            strategy.run(train_step, args=(inputs, labels))
        start = time.perf_counter()
        for _ in range(args.steps):
            inputs, labels = next(batches)
            strategy.run(train_step, args=(inputs, labels))
        elapsed = time.perf_counter() - start
    return {"samples_per_second": args.steps * batch / elapsed}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["fit", "loop"])
    p.add_argument("--model", choices=sorted(SIZES), default="seed_large")
    p.add_argument("--threads", type=int, default=0, help="compute threads (0: every core)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--replicas", type=int, default=1,
                   help="loop: MirroredStrategy replicas, each a share of the threads (1: the seeds' one worker)")
    args = p.parse_args()
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.keras.utils.set_random_seed(0)
    out = run_fit(args) if args.mode == "fit" else run_loop(args)
    out.update(mode=args.mode, model="seed_large" if args.mode == "fit" else args.model, threads=args.threads,
               replicas=args.replicas)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
