"""tf.summary: TensorBoard's event files from a custom loop.

    writer = tf.summary.create_file_writer("logs/train")
    with writer.as_default(step=0):
        tf.summary.scalar("loss", loss, step=step)

The files are TensorFlow's own (records framed as TFRecord around Event protocol buffers),
one per writer, each event flushed as it is written; TensorBoard reads the folder as a run.
A summary written with no default writer is not written (the call returns False), as in
TensorFlow; one with no step, neither given nor set, is a ValueError."""
import contextlib
import os

import numpy as np

from . import _dtrain

_k = _dtrain.keras
_writers = []  # the default writer is the last
_state = {"step": None, "record": True}


def _step_value(step):
    if step is None:
        return None
    value = step.numpy() if hasattr(step, "numpy") else step
    return int(np.asarray(value).reshape(()))


class SummaryWriter:
    """What create_file_writer gives: writes into logdir; as_default() makes it the writer
    tf.summary's calls write to."""

    def __init__(self, logdir):
        self._logdir = os.fspath(logdir)
        self._writer = _k._EventWriter(self._logdir)
        self._closed = False

    @property
    def path(self):
        return self._writer.path

    @contextlib.contextmanager
    def as_default(self, step=None):
        previous = _state["step"]
        _writers.append(self)
        if step is not None:
            _state["step"] = step
        try:
            yield self
        finally:
            _writers.remove(self)
            if step is not None:
                _state["step"] = previous

    def set_as_default(self, step=None):
        _writers.append(self)
        if step is not None:
            _state["step"] = step

    def init(self):
        pass

    def flush(self):
        pass  # every event is flushed as it is written

    def close(self):
        self._closed = True
        while self in _writers:
            _writers.remove(self)

    def _write(self, kind, name, data, step, *extra):
        if self._closed:
            raise ValueError(f"tf.summary.{kind}: the writer of {self._logdir} is closed")
        getattr(self._writer, kind)(name, data, step, *extra)


class _NoopWriter(SummaryWriter):
    def __init__(self):  # noqa: D107 (writes nothing)
        self._closed = False
        self._logdir = ""

    def _write(self, kind, name, data, step, *extra):
        pass


def create_file_writer(logdir, max_queue=None, flush_millis=None, filename_suffix=None, name=None,
                       experimental_trackable=False, experimental_mesh=None):
    del max_queue, flush_millis, filename_suffix, name, experimental_trackable, experimental_mesh
    return SummaryWriter(logdir)


def create_noop_writer():
    return _NoopWriter()


@contextlib.contextmanager
def record_if(condition):
    previous = _state["record"]
    _state["record"] = condition
    try:
        yield
    finally:
        _state["record"] = previous


def should_record_summaries():
    condition = _state["record"]
    return bool(condition() if callable(condition) else condition) and bool(_writers)


def _emit(kind, name, data, step, *extra):
    if not should_record_summaries():
        return False
    value = _step_value(step if step is not None else _state["step"])
    if value is None:
        raise ValueError(f"tf.summary.{kind}: no step given and none set: pass step= or use "
                         "tf.summary.experimental.set_step (or writer.as_default(step=...))")
    _writers[-1]._write(kind, name, data, value, *extra)
    return True


def _number(data, fn):
    value = np.asarray(data.numpy() if hasattr(data, "numpy") else data, dtype=np.float64)
    if value.size != 1:
        raise ValueError(f"tf.summary.{fn}: data must hold one value, got shape {value.shape}")
    return float(value.reshape(()))


def scalar(name, data, step=None, description=None):
    """A number (a scalar tensor, variable or Python number) at step."""
    del description
    return _emit("scalar", name, _number(data, "scalar"), step)


def histogram(name, data, step=None, buckets=None, description=None):
    """The distribution of data's values, in `buckets` (30 by default) equal buckets between
    the smallest and the largest."""
    del description
    buckets = 30 if buckets is None else int(buckets)
    if buckets < 1:
        raise ValueError(f"tf.summary.histogram: buckets must be at least 1, got {buckets}")
    values = np.asarray(data.numpy() if hasattr(data, "numpy") else data, dtype=np.float32).reshape(-1)
    return _emit("histogram", name, np.ascontiguousarray(values), step, buckets)


def text(name, data, step=None, description=None):
    """Markdown text (a str, bytes or a string scalar), shown by TensorBoard's Text tab."""
    del description
    value = data.numpy() if hasattr(data, "numpy") else data
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size == 1 else "\n".join(
            v.decode() if isinstance(v, bytes) else str(v) for v in value.reshape(-1))
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return _emit("text", name, str(value), step)


class experimental:  # noqa: N801 (TensorFlow's module name)
    @staticmethod
    def set_step(step):
        _state["step"] = step

    @staticmethod
    def get_step():
        return _state["step"]
