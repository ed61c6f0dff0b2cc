"""ParameterServerStrategy and ClusterCoordinator: variables held by the "ps" tasks,
closures run by the "worker" tasks, scheduled by the "chief" (docs/parameter_server.md).

A worker started with tf.distribute.Server(...).join() runs no program: the chief ships
its models, functions and datasets by value (server.py). Otherwise every task runs the
same program and functions travel by name: each task defines a scheduled function when the
program first schedules it. Hence the rule for such a program's tasks:
- a ps serves from the moment it makes the strategy, and its program ends with the job;
- a worker runs the program up to its first ``coordinator.schedule`` (or ``join``), or its
  ``model.fit``, then runs what the chief sends until the job ends, and its program ends
  there; so every function the chief schedules must be scheduled (or passed to
  ``coordinator.define``) before the first ``schedule``'s point is reached on the workers.
"""
import atexit
import sys

from .. import _dtrain
from ..data import Dataset, IteratorBase

_d = _dtrain.distribute


class InputContext:
    """tf.distribute.InputContext: what distribute_datasets_from_function's function is
    told: this worker's input pipeline among num_input_pipelines, and the replicas in sync.
    (Under ParameterServerStrategy each worker runs the whole function: one pipeline.)"""

    def __init__(self, num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1):
        self.num_input_pipelines = num_input_pipelines
        self.input_pipeline_id = input_pipeline_id
        self.num_replicas_in_sync = num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size):
        if global_batch_size % self.num_replicas_in_sync != 0:
            raise ValueError(f"The `global_batch_size` {global_batch_size} is not divisible by "
                             f"`num_replicas_in_sync` {self.num_replicas_in_sync}")
        return global_batch_size // self.num_replicas_in_sync

    def __repr__(self):
        return (f"InputContext(num_input_pipelines={self.num_input_pipelines}, "
                f"input_pipeline_id={self.input_pipeline_id}, num_replicas_in_sync={self.num_replicas_in_sync})")


class ParameterServerStrategy:
    """tf.distribute.ParameterServerStrategy over the cluster TF_CONFIG names (a chief, workers
    and ps). ``consistency`` is dtrain's: 'async' (TensorFlow's), 'ssp:K' or 'sync[:B]'."""

    def __init__(self, cluster_resolver=None, variable_partitioner=None, consistency="async", _tf_config=None):
        from . import cluster_resolver as resolvers
        from .partitioners import Partitioner
        from .server import _Program, _tf_config as tf_config_of

        if variable_partitioner is not None and not isinstance(variable_partitioner, Partitioner):
            raise TypeError("ParameterServerStrategy(variable_partitioner=...): give one of "
                            "tf.distribute.experimental.partitioners' partitioners (dtrain does not call a function "
                            "of your own for it)")
        self._resolver = cluster_resolver or resolvers.TFConfigClusterResolver()
        config = _tf_config or ""
        if not config and not isinstance(self._resolver, resolvers.TFConfigClusterResolver):
            # A resolver of the cluster given in Python (SimpleClusterResolver): this process
            # is its task, the chief unless it says otherwise.
            config = tf_config_of(self._resolver.cluster_spec(), self._resolver.task_type or "chief",
                                  self._resolver.task_id or 0)
        self._partitioner = variable_partitioner
        self._cpp = _d._ParameterServerStrategy(consistency, 0.0,
                                                None if variable_partitioner is None else variable_partitioner._cpp,
                                                config)
        self._models = _Made()  # in the order made: the program shipped to workers names them so
        self._pending = set()
        self._program = None
        if _tf_config is not None:  # tf.distribute.Server's task: it serves in join()
            return
        if self._cpp.task_type == "ps":
            ClusterCoordinator(self)._cpp.serve()
            sys.exit(0)
        if self._cpp.is_chief:
            self._program = _Program(self)
            self._shipper = _d._ClusterCoordinator(self._cpp)
            # The workers and ps serve until the chief ends the job: at the latest when
            # this program ends (Python may never destroy the strategy itself).
            atexit.register(self._cpp.end_job)

    @classmethod
    def _for_task(cls, tf_config):
        return cls(_tf_config=tf_config)

    def _ship(self, what, entry):
        """The chief: adds to the program shipped to workers that run none of their own."""
        if self._program is not None:
            self._program.add(what, entry, self._shipper)

    def _ship_fit(self, model, **fit_args):
        if self._program is not None:
            self._ship(f"model.fit of model '{model.name}'",
                       ("fit", model, getattr(model, "_compile_args", None), fit_args))

    @property
    def cluster_resolver(self):
        return self._resolver

    @property
    def extended(self):
        return self

    @property
    def num_replicas_in_sync(self):
        return 1

    def scope(self):
        """Variables made inside live on the parameter servers."""
        from . import _scoped

        return _scoped(self, _d._Scope(_d._ps_backend(self._cpp)))

    def run(self, fn, args=(), kwargs=None, options=None):
        """Inside a scheduled function: runs fn on this worker (one replica)."""
        del options
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op, value, axis=None):
        """Inside a closure one replica holds the value: without an axis it is the value;
        with one, its SUM or MEAN along that axis."""
        if axis is None:
            return value
        mean = reduce_op == _d.ReduceOp.MEAN or str(reduce_op).upper().endswith("MEAN")
        return (_dtrain.ops.reduce_mean if mean else _dtrain.ops.reduce_sum)(value, axis, False)

    def experimental_distribute_dataset(self, dataset, options=None):
        del options
        return dataset

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        del options
        return dataset_fn(InputContext())

    def _build_in_replica(self, model, build):
        del model, build
        return False


class _Made(list):
    """The models made under the strategy's scope, in order (Model.__init__ adds each)."""

    def add(self, model):
        self.append(model)


class RemoteValue:
    """A scheduled closure's result; fetch() waits for it and gives numpy values."""

    def __init__(self, cpp):
        self._cpp = cpp

    def fetch(self):
        values = [t.numpy() for t in self._cpp.fetch()]
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def done(self):
        return self._cpp.done()


class PerWorkerValues:
    """A per-worker dataset's iterator, as schedule's arguments name it: each worker draws
    from its own; the chief only passes it to schedule."""

    def __init__(self, cpp):
        self._cpp = cpp

    def __iter__(self):
        return self

    def __next__(self):
        raise TypeError("a per-worker iterator is read by the workers: pass it to coordinator.schedule")


class PerWorkerDataset:
    def __init__(self, cpp):
        self._cpp = cpp

    def __iter__(self):
        return PerWorkerValues(self._cpp.iterator())


class _WorkerIterator(IteratorBase):
    """The per-worker dataset's iterator on the worker running a closure."""

    def __init__(self, cpp):
        self._cpp = cpp

    def __next__(self):
        parts = self._cpp.next()
        return tuple(parts) if len(parts) > 1 else parts[0]


class ClusterCoordinator:
    """tf.distribute.coordinator.ClusterCoordinator: schedule closures on the workers."""

    def __init__(self, strategy):
        if not isinstance(strategy, ParameterServerStrategy):
            raise TypeError("ClusterCoordinator takes a ParameterServerStrategy")
        self.strategy = strategy
        self._cpp = _d._ClusterCoordinator(strategy._cpp)
        self._defined = {}

    def define(self, fn, takes_iterator=True):
        """Defines fn under its qualified name on this task (schedule does it the first time
        it meets fn); a worker must define every function the chief schedules before it
        serves."""
        remote = self._defined.get(fn)
        if remote is None:
            name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
            remote = self._define_as(name, fn, takes_iterator)
            self.strategy._ship(f"function '{name}'", ("function", name, fn, takes_iterator))
        return remote

    def _define_as(self, name, fn, takes_iterator):
        if takes_iterator:
            remote = self._cpp.define_iterator_function(name, lambda it: fn(_WorkerIterator(it)))
        else:
            remote = self._cpp.define_function(name, fn)
        self._defined[fn] = remote
        return remote

    def create_per_worker_dataset(self, dataset_fn):
        """Each worker builds the dataset with dataset_fn() (a Dataset also works)."""
        self.strategy._ship(f"per-worker dataset function '{getattr(dataset_fn, '__qualname__', dataset_fn)}'",
                            ("dataset", dataset_fn))
        if isinstance(dataset_fn, Dataset):
            dataset = dataset_fn
            dataset_fn = lambda: dataset  # noqa: E731
        return PerWorkerDataset(self._cpp.create_per_worker_dataset(lambda: _as_dataset(dataset_fn())))

    def schedule(self, fn, args=None, kwargs=None):
        """Queues fn on some worker; returns its RemoteValue. fn takes no arguments, or a
        per-worker dataset's iterator."""
        if kwargs:
            raise NotImplementedError("schedule(kwargs=...) is not supported by dtrain: give fn at most one "
                                      "argument, a per-worker iterator")
        args = tuple(args or ())
        if len(args) > 1 or (args and not isinstance(args[0], PerWorkerValues)):
            raise TypeError("schedule: dtrain's closures take no arguments or one per-worker dataset iterator")
        remote = self.define(fn, takes_iterator=bool(args))
        self._serve_unless_chief()
        if args:
            return RemoteValue(self._cpp.schedule_with(remote, args[0]._cpp))
        return RemoteValue(self._cpp.schedule(remote))

    def join(self):
        self._serve_unless_chief()
        self._cpp.join()

    def done(self):
        return self._cpp.done()

    def fetch(self, val):
        if isinstance(val, RemoteValue):
            return val.fetch()
        if isinstance(val, (list, tuple)):
            return type(val)(self.fetch(v) for v in val)
        if isinstance(val, dict):
            return {k: self.fetch(v) for k, v in val.items()}
        return val

    def _serve_unless_chief(self):
        if self.strategy._cpp.is_chief:
            return
        self._cpp.serve()
        sys.exit(0)


def _as_dataset(value):
    from . import DistributedDataset

    if isinstance(value, DistributedDataset):
        return value._dataset
    if not isinstance(value, Dataset):
        raise TypeError(f"create_per_worker_dataset: the function returned a {type(value).__name__}, not a Dataset")
    return value
