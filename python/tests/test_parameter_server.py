"""ParameterServerStrategy from Python: a chief, two workers and a ps started by
`python3 -m dtrain launch` (127.0.0.1), training with model.fit and with the coordinator's
custom loop (TensorFlow's per-worker dataset and step_fn), to the accuracy the model
reaches on one device; every task ends when the chief's program does."""
import re
import sys

from conftest import run_python

DATA = r'''
import numpy as np
import dtrain as tf
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 20)).astype(np.float32)
y = np.argmax(x[:, :4], axis=1)
'''

FIT = DATA + r'''
strategy = tf.distribute.ParameterServerStrategy(
    tf.distribute.cluster_resolver.TFConfigClusterResolver(),
    variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=1024,
                                                                                     max_shards=2))
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(20,),
                                                       kernel_constraint=tf.keras.constraints.MaxNorm(1.0, axis=1)),
                                 tf.keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, epochs=5, batch_size=32, verbose=0)
if strategy.cluster_resolver.task_type == "chief":
    print("chief accuracy", history.history["accuracy"][-1])
    for variable, shard, shards, ps in strategy._cpp.placement():
        print("shard", variable, shard, shards, ps)
    print("largest row norm", float(np.sqrt((model.layers[0].kernel.numpy() ** 2).sum(axis=1)).max()))
'''

# TensorFlow's custom loop: a per-worker dataset and a step_fn the chief schedules.
LOOP_BODY = r'''
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(20,)),
                                 tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.Adam(0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
GLOBAL_BATCH = 32

def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).batch(batch).repeat()

@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

@tf.function
def step_fn(iterator):
    def replica_fn(batch_data, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(batch_data, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss
    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

for epoch in range(4):
    values = [coordinator.schedule(step_fn, args=(per_worker_iterator,)) for _ in range(64)]
    coordinator.join()
    print("epoch", epoch, "loss", float(values[-1].fetch()))
accuracy = tf.keras.metrics.SparseCategoricalAccuracy()
accuracy.update_state(y, model(x))
print("chief accuracy", accuracy.result())
'''

LOOP = DATA + "strategy = tf.distribute.ParameterServerStrategy()\n" + LOOP_BODY


def _launch(tmp_path, program, ps=1, env=None):
    script = tmp_path / "job.py"
    script.write_text(program)
    return run_python("-m", "dtrain", "launch", "--chief", "--workers", "2", "--ps", str(ps), "--timeout", "100", "--",
                      sys.executable, str(script), timeout=150, env=env)


def _chief_accuracy(output):
    found = re.findall(r"^\[chief:0\] chief accuracy (\S+)$", output, re.M)
    assert found, output[-3000:]
    return float(found[-1])


def test_model_fit_trains_on_the_parameter_servers(tmp_path):
    code, output = _launch(tmp_path, FIT, ps=2)
    assert code == 0, output[-3000:]
    # One device reaches about 0.85 in these 5 epochs; asynchronous updates from two workers as much.
    assert _chief_accuracy(output) >= 0.75
    # The partitioner split the 2,560-byte kernel in two, one shard on each ps; the rest stayed whole.
    shards = re.findall(r"^\[chief:0\] shard (\S+) (\d) (\d) (\d)$", output, re.M)
    kernel = [s for s in shards if s[0].endswith("/kernel") and s[0].startswith("dense/")]
    assert sorted(kernel) == [(kernel[0][0], "0", "2", "0"), (kernel[0][0], "1", "2", "1")], shards
    assert all(s[2] == "1" for s in shards if s not in kernel), shards
    # Each ps applied the kernel's MaxNorm to its rows.
    assert float(re.search(r"largest row norm (\S+)", output).group(1)) <= 1.0 + 1e-5


def test_partitioners_give_shards_per_axis_by_tensorflows_rules():
    import dtrain as tf
    p = tf.distribute.experimental.partitioners
    assert p.FixedShardsPartitioner(2)([10, 3], tf.float32) == [2, 1]
    assert p.FixedShardsPartitioner(4)([3], tf.float32) == [3]  # at most one shard per row
    # TensorFlow's documented examples.
    assert p.MinSizePartitioner(min_shard_bytes=4, max_shards=2)([6, 1], tf.float32) == [2, 1]
    assert p.MinSizePartitioner(min_shard_bytes=4, max_shards=10)([6, 1], tf.float32) == [6, 1]
    assert p.MaxSizePartitioner(max_shard_bytes=4)([6, 1], tf.float32) == [6, 1]
    assert p.MaxSizePartitioner(max_shard_bytes=4, max_shards=2)([6, 1], tf.float32) == [2, 1]
    assert p.MaxSizePartitioner(max_shard_bytes=1024)([6, 1], tf.float32) == [1, 1]
    with __import__("pytest").raises(TypeError, match="partitioners"):
        tf.distribute.ParameterServerStrategy(variable_partitioner=lambda shape, dtype: [2, 1])


def test_the_coordinators_custom_loop_trains_and_every_task_ends(tmp_path):
    code, output = _launch(tmp_path, LOOP)
    assert code == 0, output[-3000:]
    assert len(re.findall(r"^\[chief:0\] epoch \d loss", output, re.M)) == 4
    assert _chief_accuracy(output) >= 0.85


# TensorFlow's shape of a parameter-server program: the workers and the ps start a
# tf.distribute.Server and join it, never reaching the training code below; the chief ships
# them its model, its dataset_fn and its step_fn by value.
SERVERS = DATA + r'''
import os, sys
cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=cluster_resolver.task_type,
                                  task_index=cluster_resolver.task_id,
                                  protocol=cluster_resolver.rpc_layer or "grpc", start=True)
    server.join()
    print("served")
    sys.exit(0)
'''

SERVERS_FIT = SERVERS + r'''
strategy = tf.distribute.ParameterServerStrategy(
    cluster_resolver,
    variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=1024,
                                                                                     max_shards=2))

def dataset_fn(input_context):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).batch(32).repeat()

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(20,)),
                                 tf.keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=4)
out = os.environ["OUT"]
callbacks = [tf.keras.callbacks.ModelCheckpoint(filepath=os.path.join(out, "ckpt", "weights.{epoch:02d}.h5"),
                                                save_weights_only=True),
             tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(out, "backup")),
             tf.keras.callbacks.TensorBoard(log_dir=os.path.join(out, "logs"))]
history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=4, steps_per_epoch=64,
                    callbacks=callbacks, verbose=0)
print("chief accuracy", history.history["accuracy"][-1])
print("shards", sorted(n for n, shard, shards, ps in strategy._cpp.placement() if shards == 2 and shard == 0))
'''

SERVERS_LOOP = SERVERS + "strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)\n" + LOOP_BODY


def test_servers_that_join_run_the_fit_the_chief_ships(tmp_path):
    code, output = _launch(tmp_path, SERVERS_FIT, ps=2, env={"OUT": str(tmp_path)})
    assert code == 0, output[-3000:]
    assert _chief_accuracy(output) >= 0.75
    # Every worker and ps served until the chief ended the job, then its join() returned.
    assert sorted(re.findall(r"^\[(\w+:\d)\] served$", output, re.M)) == ["ps:0", "ps:1", "worker:0", "worker:1"]
    assert re.search(r"^\[chief:0\] shards \['dense/kernel'\]$", output, re.M), output[-3000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [f"weights.{e:02d}.h5" for e in range(1, 5)]
    assert any((tmp_path / "logs" / "train").glob("events.out.tfevents.*"))


def test_servers_that_join_run_the_step_fn_the_chief_schedules(tmp_path):
    code, output = _launch(tmp_path, SERVERS_LOOP)
    assert code == 0, output[-3000:]
    assert _chief_accuracy(output) >= 0.85
    assert sorted(re.findall(r"^\[(\w+:\d)\] served$", output, re.M)) == ["ps:0", "worker:0", "worker:1"]


SERVERS_UNPICKLABLE = SERVERS + r'''
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(20,))])
accuracy = tf.keras.metrics.SparseCategoricalAccuracy()  # a dtrain object pickle cannot send

def step_fn():
    accuracy.update_state(y[:32], model(x[:32]))
    return accuracy.result()

try:
    coordinator.schedule(step_fn).fetch()
except tf.errors.InvalidArgumentError as e:
    print("refused:", e)
'''


def test_what_cannot_be_shipped_is_named_and_every_task_ends(tmp_path):
    code, output = _launch(tmp_path, SERVERS_UNPICKLABLE)
    assert code == 0, output[-3000:]
    refused = re.search(r"^\[chief:0\] refused: (.*)$", output, re.M)
    assert refused, output[-3000:]
    for part in ("worker:", "tf.distribute.Server", "function '__main__.step_fn' cannot be sent", "pickle"):
        assert part in refused.group(1), refused.group(1)
    assert sorted(re.findall(r"^\[(\w+:\d)\] served$", output, re.M)) == ["ps:0", "worker:0", "worker:1"]
