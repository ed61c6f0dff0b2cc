"""tf.train: Checkpoint and CheckpointManager.

A checkpoint holds every variable of its models, every optimizer's slots and iteration
count, dataset iterators' positions and the random streams, in one checksummed file
written atomically (docs/checkpoints.md). Restoring is strict: every tracked object must
be in the file with its shapes, or nothing changes and the error names the file and the
tensor."""
import json
import os
import re

from . import _dtrain
from .data import DatasetIterator
from .distribute.server import ClusterSpec  # noqa: F401 (tf.train.ClusterSpec)

_t = _dtrain.train


class CheckpointLoadStatus:
    """What restore found; assert_consumed fails on entries of the file nothing took."""

    def __init__(self, status):
        self._status = status

    def assert_consumed(self):
        if self._status is not None:
            self._status.assert_consumed()
        return self

    def assert_existing_objects_matched(self):
        return self

    def assert_nontrivial_match(self):
        return self

    def expect_partial(self):
        return self

    def run_restore_ops(self, session=None):
        del session


def _cpp_object(name, value):
    from .keras.models import Model

    if isinstance(value, Model):
        return value._model()
    if isinstance(value, DatasetIterator):
        return value._cpp
    if isinstance(value, (_dtrain.Variable, _dtrain.keras.optimizers.Optimizer)):
        return value
    from .distribute import DistributedIterator

    if isinstance(value, DistributedIterator):
        raise TypeError(f"Checkpoint: '{name}' is a distributed dataset's iterator, which dtrain cannot track yet; "
                        "track the dataset's own iterator, or resume with BackupAndRestore in fit")
    raise TypeError(f"Checkpoint: '{name}' is a {type(value).__name__}; "
                    "it tracks models, optimizers, variables and dataset iterators")


class Checkpoint:
    """tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator, step=variable)."""

    def __init__(self, root=None, **kwargs):
        if root is not None:
            kwargs = {"root": root, **kwargs}
        self._objects = dict(kwargs)
        self._cpp = _t._Checkpoint([(name, _cpp_object(name, value)) for name, value in kwargs.items()])

    def __getattr__(self, name):
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(name)

    @property
    def save_counter(self):
        return self._cpp.save_counter

    def save(self, file_prefix, options=None):
        """Writes <file_prefix>-<n>.safetensors, n counting saves; returns its path."""
        del options
        return self._cpp.save(os.fspath(file_prefix))

    def write(self, file_prefix, options=None):
        """Writes exactly file_prefix; returns it."""
        del options
        return self._cpp.write(os.fspath(file_prefix))

    def restore(self, save_path, options=None):
        """Restores what save or write wrote (None: nothing to restore, as for a fresh start)."""
        del options
        if save_path is None:
            return CheckpointLoadStatus(None)
        return CheckpointLoadStatus(self._cpp.restore(os.fspath(save_path)))

    read = restore


class CheckpointManager:
    """Numbered checkpoints in a folder, the oldest deleted beyond max_to_keep."""

    def __init__(self, checkpoint, directory, max_to_keep=5, keep_checkpoint_every_n_hours=None,
                 checkpoint_name="ckpt", step_counter=None, checkpoint_interval=None, init_fn=None):
        if step_counter is not None or checkpoint_interval is not None:
            raise NotImplementedError("CheckpointManager(step_counter=..., checkpoint_interval=...) is not supported by dtrain")
        self._checkpoint = checkpoint
        self._init_fn = init_fn
        self._cpp = _t._CheckpointManager(checkpoint._cpp, os.fspath(directory), 0 if max_to_keep is None else int(max_to_keep),
                                          float(keep_checkpoint_every_n_hours or 0), checkpoint_name)

    @property
    def directory(self):
        return self._cpp.directory

    @property
    def latest_checkpoint(self):
        return self._cpp.latest_checkpoint

    @property
    def checkpoints(self):
        return list(self._cpp.checkpoints)

    @property
    def checkpoint(self):
        return self._checkpoint

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        del check_interval, options
        return self._cpp.save(None if checkpoint_number is None else int(checkpoint_number))

    def sync(self):
        self._cpp.sync()

    def restore_or_initialize(self):
        """Restores the newest checkpoint that verifies (skipping damaged ones); without
        one, calls init_fn. Returns the path restored, or None."""
        path, _, _ = self._cpp.restore_latest()
        if path is None and self._init_fn is not None:
            self._init_fn()
        return path


def latest_checkpoint(checkpoint_dir, latest_filename=None):
    """The newest checkpoint a CheckpointManager listed in checkpoint_dir, else the highest
    numbered file there, else None."""
    index = os.path.join(checkpoint_dir, latest_filename or "checkpoint")
    try:
        with open(index) as f:
            latest = json.load(f).get("latest")
        if latest:
            return os.path.join(checkpoint_dir, latest)
    except (OSError, ValueError):
        pass
    best = None
    for name in os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []:
        m = re.fullmatch(r".*-(\d+)\.safetensors", name)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), name)
    return None if best is None else os.path.join(checkpoint_dir, best[1])
