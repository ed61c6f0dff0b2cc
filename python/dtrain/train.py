"""tf.train: Checkpoint and CheckpointManager.

A checkpoint holds every variable of its models, every optimizer's slots and iteration
count, dataset iterators' positions and the random streams, in one checksummed file
written atomically (docs/checkpoints.md). Restoring is strict: every tracked object must
be in the file with its shapes, or nothing changes and the error names the file and the
tensor."""
import json
import os
import re

import numpy as np

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


# ---- tf.train.Example: the message TFRecord files of TensorFlow's data sets hold. Built and
# read as protobuf's Python classes are (Example(features=Features(feature={...})),
# example.features.feature["x"].float_list.value, SerializeToString, FromString); the bytes
# are protobuf's wire format, written and read by dtrain's C++ side.

class _ValueList:
    def __init__(self, value=None):
        self.value = list(value) if value is not None else []

    def __eq__(self, other):
        return type(self) is type(other) and list(self.value) == list(other.value)

    def __repr__(self):
        return f"{type(self).__name__}(value={self.value!r})"


class BytesList(_ValueList):
    """tf.train.BytesList(value=[bytes, ...]) (str values are written as UTF-8)."""


class FloatList(_ValueList):
    """tf.train.FloatList(value=[float, ...]), float32 on the wire."""


class Int64List(_ValueList):
    """tf.train.Int64List(value=[int, ...])."""


class Feature:
    """tf.train.Feature(bytes_list=..., float_list=... or int64_list=...): one of the three."""

    _KINDS = ("bytes_list", "float_list", "int64_list")

    def __init__(self, bytes_list=None, float_list=None, int64_list=None):
        given = [(k, v) for k, v in zip(self._KINDS, (bytes_list, float_list, int64_list)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"Feature: one of bytes_list, float_list and int64_list, got {', '.join(k for k, _ in given)}")
        self._kind = given[0][0] if given else None
        self.bytes_list = bytes_list if bytes_list is not None else BytesList()
        self.float_list = float_list if float_list is not None else FloatList()
        self.int64_list = int64_list if int64_list is not None else Int64List()

    def WhichOneof(self, group):  # noqa: N802 (protobuf's name)
        if group != "kind":
            raise ValueError(f"Feature has no oneof {group!r}")
        return self._kind

    def HasField(self, field):  # noqa: N802
        return field == self._kind

    def __eq__(self, other):
        return isinstance(other, Feature) and self._kind == other._kind and (
            self._kind is None or getattr(self, self._kind) == getattr(other, other._kind))

    def __repr__(self):
        return f"Feature({self._kind}={getattr(self, self._kind)!r})" if self._kind else "Feature()"


class Features:
    """tf.train.Features(feature={name: Feature})."""

    def __init__(self, feature=None):
        self.feature = dict(feature or {})

    def __eq__(self, other):
        return isinstance(other, Features) and self.feature == other.feature

    def __repr__(self):
        return f"Features(feature={self.feature!r})"


class Example:
    """tf.train.Example(features=Features(...)); SerializeToString() gives protobuf's bytes
    (features in name order, lists packed), FromString/ParseFromString read any valid
    encoding."""

    def __init__(self, features=None):
        self.features = features if features is not None else Features()

    def SerializeToString(self, deterministic=None):  # noqa: N802 (protobuf's name)
        del deterministic
        entries = []
        for key, f in self.features.feature.items():
            if not isinstance(f, Feature):
                raise TypeError(f"Example: feature {key!r} is a {type(f).__name__}, not a tf.train.Feature")
            kind = f.WhichOneof("kind")
            if kind == "bytes_list":
                entries.append((key, 1, [v.encode() if isinstance(v, str) else bytes(v) for v in f.bytes_list.value]))
            elif kind == "float_list":
                entries.append((key, 2, np.asarray(f.float_list.value, dtype=np.float32).reshape(-1)))
            elif kind == "int64_list":
                entries.append((key, 3, np.asarray(f.int64_list.value, dtype=np.int64).reshape(-1)))
            else:
                entries.append((key, 0, None))
        return _dtrain.data.serialize_example(entries)

    def ParseFromString(self, data):  # noqa: N802
        feature = {}
        for key, kind, values in _dtrain.data.parse_example_message(bytes(data)):
            name = key.decode("utf-8", "surrogateescape")
            if kind == 1:
                feature[name] = Feature(bytes_list=BytesList(values))
            elif kind == 2:
                feature[name] = Feature(float_list=FloatList(values.tolist()))
            elif kind == 3:
                feature[name] = Feature(int64_list=Int64List(values.tolist()))
            else:
                feature[name] = Feature()
        self.features = Features(feature)
        return len(data)

    @classmethod
    def FromString(cls, data):  # noqa: N802
        example = cls()
        example.ParseFromString(data)
        return example

    def __eq__(self, other):
        return isinstance(other, Example) and self.features == other.features

    def __repr__(self):
        return f"Example(features={self.features!r})"
