"""Sharded inputs as TensorFlow programs read them: Dataset.list_files, interleave,
TFRecordDataset(num_parallel_reads), and a strategy's distribute_datasets_from_function
(with its InputContext) and experimental_distribute_values_from_function."""
import numpy as np
import pytest

import dtrain as tf


def _shards(tmp_path, count=4, per=3):
    names = []
    for f in range(count):
        path = tmp_path / f"part-{f}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for r in range(per):
                w.write(str(10 * f + r))
        names.append(str(path))
    return names


def _ints(dataset):
    return [int(t.numpy()) for t in dataset]


def test_list_files_and_interleave_read_in_tensorflows_order(tmp_path):
    names = _shards(tmp_path)
    (tmp_path / "other.txt").write_text("x")
    pattern = str(tmp_path / "part-*.tfrecord")
    listed = [t.numpy().decode() for t in tf.data.Dataset.list_files(pattern, shuffle=False)]
    assert listed == names
    shuffled = [t.numpy().decode() for t in tf.data.Dataset.list_files(pattern, seed=4)]
    assert sorted(shuffled) == names and shuffled == [t.numpy().decode() for t in tf.data.Dataset.list_files(pattern, seed=4)]
    with pytest.raises(Exception, match="no files match the pattern"):
        tf.data.Dataset.list_files(str(tmp_path / "none-*"))
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    records = files.interleave(lambda f: tf.data.TFRecordDataset(f).map(tf.strings.to_number), cycle_length=2,
                               block_length=2, num_parallel_calls=tf.data.AUTOTUNE)
    assert [int(v.numpy()) for v in records] == [0, 1, 10, 11, 2, 12, 20, 21, 30, 31, 22, 32]
    parallel = tf.data.TFRecordDataset(names, num_parallel_reads=4).map(tf.strings.to_number)
    assert [int(v.numpy()) for v in parallel] == [0, 10, 20, 30, 1, 11, 21, 31, 2, 12, 22, 32]
    # A documented TensorFlow example: range(1, 6).interleave(from_tensors(x).repeat(6), 2, 4).
    doc = tf.data.Dataset.range(1, 6).interleave(lambda x: tf.data.Dataset.range(1).map(lambda _: x).repeat(6),
                                                 cycle_length=2, block_length=4)
    assert _ints(doc) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5]


def test_datasets_from_a_function_give_each_replica_its_own_elements():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    seen = []

    def dataset_fn(context):
        seen.append(context)
        batch = context.get_per_replica_batch_size(8)
        x = np.arange(36, dtype=np.float32).reshape(36, 1)
        return tf.data.Dataset.from_tensor_slices(x).shard(context.num_input_pipelines,
                                                           context.input_pipeline_id).batch(batch)

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    assert [(c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in seen] == [(1, 0, 2)]
    steps = [[r.numpy().reshape(-1).tolist() for r in batch.values] for batch in distributed]
    assert steps[0] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(steps) == 5
    # The last step: one replica's 4 rows, the other an empty batch.
    assert steps[4] == [[32, 33, 34, 35], []]
    with pytest.raises(ValueError, match="not divisible by `num_replicas_in_sync` 2"):
        tf.distribute.InputContext(1, 0, 2).get_per_replica_batch_size(7)
    # A step on the replicas' batches: each replica's sum of its own rows.
    sums = [strategy.run(lambda b: tf.reduce_sum(b), args=(batch,)) for batch in distributed]
    assert float(strategy.reduce(tf.distribute.ReduceOp.SUM, sums[0], axis=None).numpy()) == sum(range(8))
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([float(ctx.replica_id_in_sync_group), float(ctx.num_replicas_in_sync)]))
    assert [v.numpy().tolist() for v in values.values] == [[0.0, 2.0], [1.0, 2.0]]
    one = tf.distribute.OneDeviceStrategy().experimental_distribute_values_from_function(
        lambda ctx: ctx.replica_id_in_sync_group)
    assert one == 0
