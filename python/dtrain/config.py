"""tf.config: the devices this process has, and the threads dtrain's kernels use."""
import collections

from . import _dtrain


class threading:  # noqa: N801 (TensorFlow's module name)
    @staticmethod
    def set_intra_op_parallelism_threads(num_threads):
        _dtrain.set_num_threads(int(num_threads))

    @staticmethod
    def get_intra_op_parallelism_threads():
        return _dtrain.num_threads()

    @staticmethod
    def set_inter_op_parallelism_threads(num_threads):
        del num_threads  # dtrain runs one op at a time per replica


# TensorFlow's PhysicalDevice and LogicalDevice: a name and a type.
PhysicalDevice = collections.namedtuple("PhysicalDevice", ["name", "device_type"])
LogicalDevice = collections.namedtuple("LogicalDevice", ["name", "device_type"])


def _check_type(device_type, what):
    if device_type not in (None, "CPU", "GPU"):
        raise ValueError(f"{what}: device_type is 'CPU' or 'GPU', got {device_type!r}")


def list_physical_devices(device_type=None):
    """The CPU and each CUDA GPU this process can use (none where the build has no CUDA
    backend or the machine no GPU: tf.config.list_physical_devices('GPU') is then [])."""
    _check_type(device_type, "list_physical_devices")
    out = []
    if device_type in (None, "CPU"):
        out.append(PhysicalDevice("/physical_device:CPU:0", "CPU"))
    if device_type in (None, "GPU"):
        out += [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(_dtrain._gpu_count())]
    return out


def list_logical_devices(device_type=None):
    """The CPU and each logical GPU: a GPU split by set_logical_device_configuration
    counts as its parts."""
    _check_type(device_type, "list_logical_devices")
    out = []
    if device_type in (None, "CPU"):
        out.append(LogicalDevice("/device:CPU:0", "CPU"))
    if device_type in (None, "GPU"):
        out += [LogicalDevice(f"/device:GPU:{i}", "GPU") for i in range(_dtrain._logical_gpu_count())]
    return out


class LogicalDeviceConfiguration(collections.namedtuple(
        "LogicalDeviceConfiguration", ["memory_limit", "experimental_priority", "experimental_device_ordinal"])):
    """One logical GPU of a physical one: memory_limit in MiB (None: no limit of its own)."""

    def __new__(cls, memory_limit=None, experimental_priority=None, experimental_device_ordinal=0):
        return super().__new__(cls, memory_limit, experimental_priority, experimental_device_ordinal)


def _physical_name(device, what):
    """A physical GPU's name, as TensorFlow's logical-device calls take it."""
    name = device.name if isinstance(device, PhysicalDevice) else str(device)
    if not name.startswith("/physical_device:GPU:"):
        raise ValueError(f"{what}: takes a physical GPU (tf.config.list_physical_devices('GPU')[i]), got {device!r}")
    return name


def set_logical_device_configuration(device, logical_devices):
    """Splits a physical GPU into logical GPUs, as TensorFlow users test multi-GPU code on one
    GPU. They share its memory, at most the sum of their memory_limit where each has one;
    MirroredStrategy's replicas on them share the weights and sum gradients on the GPU."""
    limits = []
    for config in logical_devices or []:
        if not isinstance(config, LogicalDeviceConfiguration):
            raise TypeError("set_logical_device_configuration: each logical device is a "
                            f"tf.config.LogicalDeviceConfiguration, got {config!r}")
        if config.memory_limit is not None and int(config.memory_limit) <= 0:
            raise ValueError(f"set_logical_device_configuration: memory_limit is in MiB and > 0, got {config.memory_limit}")
        limits.append(int(config.memory_limit or 0))
    _dtrain._set_logical_device_configuration(_physical_name(device, "set_logical_device_configuration"), limits)


def get_logical_device_configuration(device):
    """The logical GPUs set for a physical GPU, or None where it is not split."""
    limits = _dtrain._logical_device_configuration(_physical_name(device, "get_logical_device_configuration"))
    return [LogicalDeviceConfiguration(memory_limit=m or None) for m in limits] or None


def get_visible_devices(device_type=None):
    return list_physical_devices(device_type)


def describe_gpus():
    """One line on the GPUs found, or why there are none (dtrain's own, not TensorFlow's)."""
    return _dtrain._describe_gpus()


class experimental:  # noqa: N801 (TensorFlow's module name)
    @staticmethod
    def enable_tensor_float_32_execution(enabled):
        """Float32 matrix products on a GPU's tensor cores in TF32 (10-bit mantissas, ~8x
        faster). Off in dtrain by default: float32 products are exact float32 unless asked."""
        _dtrain._set_tensor_float_32(bool(enabled))

    @staticmethod
    def tensor_float_32_execution_enabled():
        return _dtrain._tensor_float_32()

    @staticmethod
    def set_memory_growth(device, enable):
        """Accepted for TensorFlow's programs: dtrain's GPU memory always grows as it is
        used (a cache of blocks, freed back when an allocation would otherwise fail)."""
        del device, enable

    @staticmethod
    def get_memory_growth(device):
        del device
        return True

    @staticmethod
    def get_memory_info(device):
        """{'current': bytes in use by tensors, 'peak': the most in use} of a GPU ('GPU:0')."""
        return _dtrain._memory_info(device)

    list_physical_devices = staticmethod(list_physical_devices)
    list_logical_devices = staticmethod(list_logical_devices)
    # TensorFlow's older names for logical devices.
    VirtualDeviceConfiguration = LogicalDeviceConfiguration
    set_virtual_device_configuration = staticmethod(set_logical_device_configuration)
    get_virtual_device_configuration = staticmethod(get_logical_device_configuration)
