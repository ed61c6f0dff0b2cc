"""tf.linalg: global_norm (what clip_by_global_norm measures) and matmul."""
from ._core import global_norm, matmul

__all__ = ["global_norm", "matmul"]
