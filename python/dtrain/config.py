"""tf.config: the threads dtrain's kernels use."""
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


def list_physical_devices(device_type=None):
    if device_type not in (None, "CPU"):
        return []
    return ["/physical_device:CPU:0"]
