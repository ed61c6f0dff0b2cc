"""The seeds' code examples, run with `import tensorflow as tf` changed to
`import dtrain as tf` and completed where the seed elides (tests/seeds/, each file says
what it completed). The seeds' examples that fail in TensorFlow too are not among them
(docs/python.md lists them)."""
import math
import re

import pytest

from conftest import HERE


def losses_printed(output):
    return [float(v) for v in re.findall(r"^Loss : (\S+)$", output, re.M)]


def accuracy_printed(output):
    found = re.findall(r"^test accuracy (\S+)$", output, re.M)
    assert found, output[-2000:]
    return float(found[-1])


@pytest.mark.parametrize("example", ["seed000_example1.py", "seed000_example2.py"])
def test_multi_worker_custom_loops_learn_the_seeds_random_data(python_run, example):
    code, output = python_run(HERE / "seeds" / example)
    assert code == 0, output[-3000:]
    losses = losses_printed(output)
    per_epoch = len(losses) // 2
    assert per_epoch > 0 and len(losses) == 2 * per_epoch, output[-2000:]
    assert all(math.isfinite(v) for v in losses)
    # Random labels: what the model can reach is memorising them, a lower loss each epoch.
    first, second = losses[:per_epoch], losses[per_epoch:]
    assert sum(second) / per_epoch < sum(first) / per_epoch


def test_a_slow_generator_feeds_the_custom_loop(python_run):
    code, output = python_run(HERE / "seeds" / "seed000_example3.py")
    assert code == 0, output[-3000:]
    losses = losses_printed(output)
    # 1000 generated rows in batches of 32, twice.
    assert len(losses) == 2 * 32
    assert all(math.isfinite(v) and 0.5 < v < 10 for v in losses)


@pytest.mark.parametrize("example", ["seed002_example1.py", "seed003_example1.py", "seed003_example2.py",
                                     "seed003_example3.py"])
def test_fashion_mnist_examples_reach_an_mlps_accuracy(python_run, example):
    code, output = python_run(HERE / "seeds" / example)
    assert code == 0, output[-3000:]
    # A 784-128-10 MLP on 10000 images reaches about 0.85 on the 10000 test images.
    assert accuracy_printed(output) >= 0.80
