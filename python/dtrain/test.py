"""tf.test: whether this build and machine run on a GPU."""
from . import _dtrain


def is_built_with_cuda():
    """Whether this build of dtrain has its CUDA backend."""
    return _dtrain._built_with_cuda()


def is_gpu_available(cuda_only=False, min_cuda_compute_capability=None):
    """Whether a GPU is present (TensorFlow's older test; list_physical_devices('GPU') is its
    newer form)."""
    del cuda_only, min_cuda_compute_capability
    return _dtrain._gpu_count() > 0


def gpu_device_name():
    """'/device:GPU:0' where a GPU is present, else ''."""
    return "/device:GPU:0" if _dtrain._gpu_count() > 0 else ""
