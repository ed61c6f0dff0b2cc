"""tf.keras.callbacks. Subclass Callback in Python: fit calls its methods between batches
(holding the GIL for them) with Keras's arguments, and ``self.model`` is the model."""
from .. import _dtrain

_c = _dtrain.keras.callbacks
Callback = _c.Callback
EarlyStopping = _c.EarlyStopping
TerminateOnNaN = _c.TerminateOnNaN
CSVLogger = _c.CSVLogger
LearningRateScheduler = _c.LearningRateScheduler
ModelCheckpoint = _c.ModelCheckpoint
ReduceLROnPlateau = _c.ReduceLROnPlateau
BackupAndRestore = _c.BackupAndRestore


def TensorBoard(log_dir="logs", histogram_freq=0, write_graph=True, write_images=False,  # noqa: N802 (Keras's name)
                write_steps_per_second=False, update_freq="epoch", profile_batch=0, embeddings_freq=0,
                embeddings_metadata=None, **kwargs):
    """Keras's TensorBoard: event files under log_dir/train and log_dir/validation (worker
    K of a multi-worker job: log_dir/worker_K/...) with the epochs' metrics, batch metrics
    every update_freq batches, weight histograms every histogram_freq epochs, the run's
    config as text, and for profile_batch a trace of fit's first steps where TensorBoard's
    profile plugin looks. write_graph is accepted (dtrain writes the model's JSON in the
    run's config instead); images and embeddings are not written."""
    del write_graph
    if kwargs:
        raise TypeError("TensorBoard: unexpected argument(s) " + ", ".join(sorted(kwargs)))
    for name, value in (("write_images", write_images), ("embeddings_freq", embeddings_freq),
                        ("embeddings_metadata", embeddings_metadata)):
        if value:
            raise NotImplementedError(f"TensorBoard({name}=...) is not supported by dtrain")
    if update_freq == "epoch":
        every = 0
    elif update_freq == "batch":
        every = 1
    elif isinstance(update_freq, int) and not isinstance(update_freq, bool) and update_freq >= 1:
        every = update_freq
    else:
        raise ValueError(f"TensorBoard: update_freq must be 'epoch', 'batch' or a number >= 1, got {update_freq!r}")
    if isinstance(profile_batch, str):
        parts = [p for p in profile_batch.split(",") if p.strip()]
        profile_batch = tuple(int(p) for p in parts) if parts else 0
    if isinstance(profile_batch, (tuple, list)):
        if len(profile_batch) != 2:
            raise ValueError(f"TensorBoard: profile_batch is a batch or a (first, last) pair, got {profile_batch!r}")
        first, last = int(profile_batch[0]), int(profile_batch[1])
    else:
        first = last = int(profile_batch)
    return _c._TensorBoard(str(log_dir), int(histogram_freq), every, bool(write_steps_per_second), first, last)


class History:
    """What fit returns: ``history`` maps each log ("loss", "accuracy", "val_loss", ...) to
    its value at the end of every epoch; ``epoch`` lists the epochs trained. ``non_finite``
    names the first step whose loss or weights were not finite ("the loss was nan at epoch
    2, batch 8"), None when every one was."""

    def __init__(self):
        self.history = {}
        self.epoch = []
        self.params = {}
        self.model = None
        self.epoch_seconds = []
        self.samples_per_second = []
        self.input_wait_seconds = []  # each epoch's wait for input batches (dtrain's)
        self.non_finite = None

    def _set(self, cpp):
        self.history = cpp.history
        self.epoch = list(cpp.epoch)
        self.epoch_seconds = list(cpp.epoch_seconds)
        self.samples_per_second = list(cpp.samples_per_second)
        self.input_wait_seconds = list(cpp.input_wait_seconds)
        self.non_finite = cpp.non_finite


class LambdaCallback(Callback):
    """Callback from plain functions (on_epoch_end=lambda epoch, logs: ...)."""

    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_batch_begin=None, on_batch_end=None,
                 on_train_begin=None, on_train_end=None, **kwargs):
        super().__init__()
        self._fns = {"on_epoch_begin": on_epoch_begin, "on_epoch_end": on_epoch_end,
                     "on_train_batch_begin": on_batch_begin or kwargs.pop("on_train_batch_begin", None),
                     "on_train_batch_end": on_batch_end or kwargs.pop("on_train_batch_end", None),
                     "on_train_begin": on_train_begin, "on_train_end": on_train_end}
        if kwargs:
            raise TypeError("LambdaCallback: unexpected argument(s) " + ", ".join(sorted(kwargs)))

    def _call(self, name, *args):
        if self._fns[name]:
            self._fns[name](*args)

    def on_epoch_begin(self, epoch, logs=None):
        self._call("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._call("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._call("on_train_batch_begin", batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._call("on_train_batch_end", batch, logs)

    def on_train_begin(self, logs=None):
        self._call("on_train_begin", logs)

    def on_train_end(self, logs=None):
        self._call("on_train_end", logs)
