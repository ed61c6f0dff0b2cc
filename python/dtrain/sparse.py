"""tf.sparse: SparseTensor (what parsing a VarLenFeature gives) and to_dense."""
from .io import SparseTensor, sparse_to_dense as to_dense

__all__ = ["SparseTensor", "to_dense"]
