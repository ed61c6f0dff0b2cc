"""MultiWorkerMirroredStrategy from Python: two processes that `python3 -m dtrain launch`
starts with their TF_CONFIG (127.0.0.1) run the seeds' custom loop and then fit, and end
with the weights one process reaches on the same global batches."""
import sys

import numpy as np

from conftest import HERE, run_python

SCRIPT = r'''
import sys
import numpy as np
import dtrain as tf

mode, out, tests = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tests)
from loops import train_custom_loop

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
losses = train_custom_loop(strategy, model, optimizer, x, y, global_batch)
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
    code, output = run_python(script, "one", str(tmp_path / "one"), str(HERE), timeout=120)
    assert code == 0, output
    code, output = run_python("-m", "dtrain", "launch", "--workers", "2", "--timeout", "100", "--",
                              sys.executable, str(script), "multi", str(tmp_path / "multi"), str(HERE), timeout=150)
    assert code == 0, output
    assert "worker 0 of 2" in output and "worker 1 of 2" in output, output
    one = np.load(tmp_path / "one.0.npy")
    first, second = np.load(tmp_path / "multi.0.npy"), np.load(tmp_path / "multi.1.npy")
    np.testing.assert_array_equal(first, second)  # every worker holds the same weights
    np.testing.assert_allclose(first, one, rtol=1e-4, atol=1e-6)
