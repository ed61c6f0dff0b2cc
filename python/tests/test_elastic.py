"""An elastic job from Python: `python3 -m dtrain launch --workers 2:3` starts three
processes; worker:2 kills itself (SIGKILL) in the middle of fit, and the other two go on
from their last commit in memory. Their weights are those one process reaches on the same
global batches (to the rounding of the gradient sums' order)."""
import sys

import numpy as np
import pytest

from conftest import run_python

SCRIPT = r'''
import os, signal, sys
import numpy as np
import dtrain as tf

out = sys.argv[1]
tf.keras.utils.set_random_seed(3)
if sys.argv[2] == "one":
    strategy = tf.distribute.OneDeviceStrategy()
else:
    # What `dtrain launch --workers MIN:MAX` set, given explicitly (the strategy would read it by itself).
    low, high = os.environ["DTRAIN_ELASTIC"].split(":")
    strategy = tf.distribute.MultiWorkerMirroredStrategy(elastic=tf.distribute.experimental.ElasticOptions(
        int(low), int(high), os.environ["DTRAIN_ELASTIC_STORE"], os.environ["DTRAIN_ELASTIC_ID"], commit_every=4))
rng = np.random.default_rng(9)
x = rng.normal(size=(480, 8)).astype(np.float32)
y = (x[:, 0] - x[:, 1] > 0).astype(np.int64)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
def maybe_die(batch, logs=None):
    if os.environ.get("DTRAIN_ELASTIC_ID") == "worker:2" and batch == 9:
        print("worker:2 kills itself at batch", batch, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
model.fit(x, y, epochs=2, batch_size=24, shuffle=False, verbose=0,
          callbacks=[tf.keras.callbacks.LambdaCallback(on_train_batch_begin=maybe_die)])
index = strategy._cpp.worker_index
np.save(f"{out}.{index}.npy", np.concatenate([w.ravel() for w in model.get_weights()]))
print("done: worker", index, "of", strategy._cpp.num_workers, flush=True)
'''


def test_an_elastic_job_from_python_goes_on_without_a_killed_worker(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    code, output = run_python(script, str(tmp_path / "one"), "one", timeout=120)
    assert code == 0, output
    code, output = run_python("-m", "dtrain", "launch", "--workers", "2:3", "--timeout", "100", "--",
                              sys.executable, str(script), str(tmp_path / "elastic"), "elastic", timeout=150)
    assert code == 0, output
    assert "worker:2 kills itself at batch 9" in output, output
    assert "elastic: round 1, 2 worker(s) (worker:0, worker:1); gone: worker:2" in output, output
    assert "done: worker 0 of 2" in output and "done: worker 1 of 2" in output, output
    one = np.load(tmp_path / "one.0.npy")
    first, second = np.load(tmp_path / "elastic.0.npy"), np.load(tmp_path / "elastic.1.npy")
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, one, rtol=0, atol=1e-5)


def test_elastic_takes_elastic_options_only():
    import dtrain as tf
    with pytest.raises(TypeError, match="ElasticOptions"):
        tf.distribute.MultiWorkerMirroredStrategy(elastic={"min_workers": 1})
