"""Devices as TensorFlow's programs ask about them: tf.config, tf.device, tf.test and
OneDeviceStrategy. Where this machine has no GPU, asking for one is an error naming what
was found; where it has one, the same program trains there."""
import numpy as np
import pytest

import dtrain as tf

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))


def test_the_cpu_is_listed_and_gpus_as_the_machine_has_them():
    cpus = tf.config.list_physical_devices("CPU")
    assert cpus == [tf.config.PhysicalDevice("/physical_device:CPU:0", "CPU")]
    assert cpus[0].device_type == "CPU"
    gpus = tf.config.list_physical_devices("GPU")
    assert all(g.device_type == "GPU" and g.name.startswith("/physical_device:GPU:") for g in gpus)
    assert tf.config.list_physical_devices() == cpus + gpus
    assert [d.name for d in tf.config.list_logical_devices("CPU")] == ["/device:CPU:0"]
    assert tf.test.is_gpu_available() == HAS_GPU
    assert tf.test.gpu_device_name() == ("/device:GPU:0" if HAS_GPU else "")
    assert isinstance(tf.test.is_built_with_cuda(), bool)
    if not HAS_GPU:
        assert "no GPU" in tf.config.describe_gpus()
    with pytest.raises(ValueError, match="device_type"):
        tf.config.list_physical_devices("TPU")


def test_tensors_say_where_they_are_and_the_cpu_placement_nests():
    t = tf.constant([1.0, 2.0])
    assert t.device.endswith("/device:CPU:0") or t.device.endswith("/device:GPU:0")
    with tf.device("/CPU:0"):
        v = tf.Variable(np.ones((2, 2), np.float32))
        with tf.device("cpu"):
            w = tf.Variable(np.ones((2,), np.float32))
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        model.build((None, 3))
    assert v.value().device.endswith("/device:CPU:0") and w.value().device.endswith("/device:CPU:0")
    assert all(x.value().device.endswith("/device:CPU:0") for x in model.weights)


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_asking_for_a_gpu_where_there_is_none_names_what_was_found():
    with pytest.raises(tf.errors.InvalidArgumentError, match="cuda:0.*no GPU"):
        with tf.device("/GPU:0"):
            pass
    with pytest.raises(tf.errors.InvalidArgumentError, match="no GPU"):
        tf.distribute.OneDeviceStrategy("/gpu:0")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a device name"):
        with tf.device("/TPU:0"):
            pass
    # The failed scope left the placement as it was.
    assert tf.Variable(np.ones(2, np.float32)).value().device.endswith("/device:CPU:0")


def test_tensor_float_32_is_off_until_asked_for():
    assert tf.config.experimental.tensor_float_32_execution_enabled() is False
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        assert tf.config.experimental.tensor_float_32_execution_enabled() is True
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(False)
    # TensorFlow's programs set memory growth before using a GPU: accepted.
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)


def _data(seed):
    """256 rows of 8 features, labelled by the first one's sign."""
    x = np.random.default_rng(seed).standard_normal((256, 8)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _small_model():
    """A seeded two-layer classifier, compiled, made wherever the caller's scope puts it."""
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_a_model_trains_on_the_gpu_as_on_the_cpu():
    x, y = _data(0)

    def trained(device):
        with tf.device(device):
            model = _small_model()
            model.fit(x, y, epochs=2, batch_size=32, verbose=0, shuffle=False)
        return model

    on_gpu, on_cpu = trained("/GPU:0"), trained("/CPU:0")
    assert on_gpu.weights[0].value().device.endswith("GPU:0")
    for a, b in zip(on_gpu.weights, on_cpu.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    assert tf.config.experimental.get_memory_info("GPU:0")["current"] > 0


def test_dataset_apply_takes_a_transformation_and_refuses_other_results():
    ds = tf.data.Dataset.range(6).apply(lambda d: d.batch(4))
    assert [b.numpy().tolist() for b in ds] == [[0, 1, 2, 3], [4, 5]]
    with pytest.raises(TypeError, match="returned a list"):
        tf.data.Dataset.range(2).apply(lambda d: [d])


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_prefetch_to_device_without_a_gpu_names_what_was_found():
    ds = tf.data.Dataset.range(4).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cuda:0.*no GPU"):
        ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not to the CPU"):
        ds.apply(tf.data.experimental.prefetch_to_device("/cpu:0"))


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_a_dataset_prefetched_to_the_gpu_trains_as_on_the_cpu():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x[:, 1] > 0).astype(np.int32)

    def trained(device, prefetch):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        if prefetch:
            ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=2))
        with tf.device(device):
            tf.keras.utils.set_random_seed(3)
            model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                         tf.keras.layers.Dense(2)])
            model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(ds, epochs=2, verbose=0)
        return model

    on_gpu, on_cpu = trained("/GPU:0", True), trained("/CPU:0", False)
    for a, b in zip(on_gpu.weights, on_cpu.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_logical_device_configurations_are_checked_and_need_a_gpu():
    config = tf.config.LogicalDeviceConfiguration(memory_limit=1024)
    assert config.memory_limit == 1024 and tf.config.LogicalDeviceConfiguration().memory_limit is None
    assert tf.config.experimental.VirtualDeviceConfiguration is tf.config.LogicalDeviceConfiguration
    with pytest.raises(TypeError, match="LogicalDeviceConfiguration"):
        tf.config.set_logical_device_configuration("/physical_device:GPU:0", [1024])
    with pytest.raises(ValueError, match="memory_limit is in MiB"):
        tf.config.set_logical_device_configuration("/physical_device:GPU:0",
                                                   [tf.config.LogicalDeviceConfiguration(memory_limit=-1)])
    with pytest.raises(TypeError, match="CrossDeviceOps"):
        tf.distribute.MirroredStrategy(cross_device_ops="nccl")
    with pytest.raises(ValueError, match="takes a physical GPU"):
        tf.config.set_logical_device_configuration("/device:GPU:0", [config])
    assert tf.distribute.NcclAllReduce(num_packs=0).num_packs == 0
    if not HAS_GPU:
        assert tf.config.list_logical_devices("GPU") == []
        with pytest.raises(tf.errors.InvalidArgumentError, match="no GPU"):
            tf.config.set_logical_device_configuration("/physical_device:GPU:0", [config, config])


@pytest.mark.skipif(len(tf.config.list_physical_devices("GPU")) != 1, reason="needs one GPU")
def test_mirrored_strategy_on_two_logical_gpus_trains_as_the_gpu_alone():
    x, y = _data(1)

    def trained(strategy):
        with strategy.scope():
            model = _small_model()
        model.fit(x, y, epochs=2, batch_size=64, verbose=0, shuffle=False)
        return model

    gpu = tf.config.list_physical_devices("GPU")[0]
    alone = trained(tf.distribute.OneDeviceStrategy("/gpu:0"))
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=4096)] * 2)
    try:
        assert len(tf.config.list_logical_devices("GPU")) == len(tf.config.list_physical_devices("GPU")) + 1
        assert len(tf.config.get_logical_device_configuration(gpu)) == 2
        strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
        assert strategy.num_replicas_in_sync == 2
        split = trained(strategy)
    finally:
        tf.config.set_logical_device_configuration(gpu, [])
    for a, b in zip(split.weights, alone.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
