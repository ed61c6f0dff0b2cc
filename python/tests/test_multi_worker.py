"""MultiWorkerMirroredStrategy from Python: two processes that `python3 -m dtrain launch`
starts with their TF_CONFIG (127.0.0.1) run the seeds' custom loop and then fit, and end
with the weights one process reaches on the same global batches."""
import sys

import numpy as np

from conftest import run_python

SCRIPT = r'''
import sys
import numpy as np
import dtrain as tf

mode, out = sys.argv[1], sys.argv[2]
tf.keras.utils.set_random_seed(3)
strategy = tf.distribute.MultiWorkerMirroredStrategy() if mode == "multi" else tf.distribute.OneDeviceStrategy()
rng = np.random.default_rng(9)
x = rng.normal(size=(512, 8)).astype(np.float32)
y = (x[:, 0] - x[:, 1] > 0).astype(np.int64)
global_batch = 32
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(0.05)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

def step(inputs, labels):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_fn(labels, model(inputs, training=True)), global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
losses = []
for inputs, labels in strategy.experimental_distribute_dataset(dataset):
    per_replica = strategy.run(step, args=(inputs, labels))
    losses.append(float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)))
with strategy.scope():
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(x, y, epochs=2, batch_size=global_batch, shuffle=False, verbose=0)
index = strategy._cpp.worker_index
np.save(f"{out}.{index}.npy", np.concatenate([w.ravel() for w in model.get_weights()] + [np.array(losses)]))
print("worker", index, "of", strategy._cpp.num_workers, "accuracy", history.history["accuracy"][-1])
'''


def test_two_workers_from_python_reach_one_processs_weights(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    code, output = run_python(script, "one", str(tmp_path / "one"), timeout=120)
    assert code == 0, output
    code, output = run_python("-m", "dtrain", "launch", "--workers", "2", "--timeout", "100", "--",
                              sys.executable, str(script), "multi", str(tmp_path / "multi"), timeout=150)
    assert code == 0, output
    assert "worker 0 of 2" in output and "worker 1 of 2" in output, output
    one = np.load(tmp_path / "one.0.npy")
    first, second = np.load(tmp_path / "multi.0.npy"), np.load(tmp_path / "multi.1.npy")
    np.testing.assert_array_equal(first, second)  # every worker holds the same weights
    np.testing.assert_allclose(first, one, rtol=1e-4, atol=1e-6)
