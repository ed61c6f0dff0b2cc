"""Cluster resolvers from Python: Slurm's job step and a Kubernetes indexed Job as the
cluster TensorFlow's strategies take; a one-task step trains under MultiWorkerMirroredStrategy."""
import numpy as np
import pytest

import dtrain as tf

STEP = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "CUDA_VISIBLE_DEVICES": "0,1"}


def test_slurm_ranks_fill_hosts_and_jobs_take_them_in_order(monkeypatch):
    for name, value in {**STEP, "SLURM_PROCID": "2"}.items():
        monkeypatch.setenv(name, value)
    r = tf.distribute.cluster_resolver.SlurmClusterResolver(jobs={"chief": 1, "ps": 1, "worker": 2}, port_base=7000)
    assert r.cluster_spec().as_dict() == {"chief": ["n1:7000"], "ps": ["n1:7001"], "worker": ["n2:7000", "n2:7001"]}
    assert (r.task_type, r.task_id) == ("worker", 0)
    assert r.master() == "grpc://n2:7000"
    assert r.num_accelerators() == {"GPU": 2}
    assert tf.distribute.cluster_resolver.SlurmClusterResolver().task_type == "worker"
    with pytest.raises(tf.errors.InvalidArgumentError, match="the jobs name 3 task"):
        tf.distribute.cluster_resolver.SlurmClusterResolver(jobs={"worker": 3})
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(tf.errors.InvalidArgumentError, match="SLURM_PROCID is not set"):
        tf.distribute.cluster_resolver.SlurmClusterResolver()


def test_an_indexed_jobs_pods_are_named_by_job_index_and_service(monkeypatch):
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("HOSTNAME", "train-1")
    r = tf.distribute.cluster_resolver.KubernetesIndexedJobClusterResolver(service="workers", num_tasks=2)
    assert r.cluster_spec().as_dict() == {"worker": ["train-0.workers:2222", "train-1.workers:2222"]}
    assert (r.task_type, r.task_id) == ("worker", 1)


def test_a_one_task_slurm_step_trains_under_multi_worker_mirrored(monkeypatch):
    for name, value in {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NODELIST": "127.0.0.1",
                        "SLURM_STEP_TASKS_PER_NODE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TF_CONFIG", "{}")  # restored after the test: the strategy sets it
    strategy = tf.distribute.MultiWorkerMirroredStrategy(tf.distribute.cluster_resolver.SlurmClusterResolver())
    assert strategy.cluster_resolver.cluster_spec().as_dict() == {"worker": ["127.0.0.1:8888"]}
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(4,))])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(x, y, epochs=5, batch_size=32, verbose=0)
    assert history.history["accuracy"][-1] > 0.9
