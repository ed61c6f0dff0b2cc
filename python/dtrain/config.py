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
    _check_type(device_type, "list_logical_devices")
    return [LogicalDevice(d.name.replace("/physical_device:", "/device:"), d.device_type)
            for d in list_physical_devices(device_type)]


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
