"""tf.distribute: MirroredStrategy, MultiWorkerMirroredStrategy and OneDeviceStrategy over
dtrain's replicas and workers, with scope, run, reduce and distributed datasets.

A replica is a thread with its share of the cores. ``strategy.run(fn)`` calls the Python
``fn`` on every replica's thread: Python takes turns (the GIL), while every dtrain call
inside ``fn`` (the model, the loss, ``tape.gradient``, ``apply_gradients``) runs without
it, so the replicas' kernels and their cross-replica sums run side by side.
"""
import contextlib
import os
import threading
import weakref

from .. import _dtrain
from ..data import Dataset, IteratorBase, _next_pass
from . import cluster_resolver, experimental
from . import cluster_resolver as _resolvers
from .parameter_server import ClusterCoordinator, InputContext, ParameterServerStrategy, RemoteValue
from .server import Server

_d = _dtrain.distribute
ReduceOp = _d.ReduceOp

_stack = []  # the strategies whose scope is open, innermost last


@contextlib.contextmanager
def _scoped(strategy, scope):
    """`with strategy.scope():` for any strategy, given its C++ scope."""
    scope.enter()
    _stack.append(strategy)
    try:
        yield strategy
    finally:
        _stack.pop()
        scope.exit()


class PerReplica:
    """One value per replica, as strategy.run returns with several replicas."""

    def __init__(self, values):
        self.values = tuple(values)

    def __repr__(self):
        return "PerReplica:{" + ", ".join(f"{i}: {v!r}" for i, v in enumerate(self.values)) + "}"


def _regroup(values):
    """Per-replica results into one structure whose leaves are PerReplica (TensorFlow's
    regrouping): a tuple of results gives a tuple of PerReplica."""
    first = values[0]
    if isinstance(first, (tuple, list)) and all(isinstance(v, type(first)) and len(v) == len(first) for v in values):
        return type(first)(_regroup([v[i] for v in values]) for i in range(len(first)))
    if isinstance(first, dict) and all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
        return {k: _regroup([v[k] for v in values]) for k in first}
    if first is None and all(v is None for v in values):
        return None
    return PerReplica(values)


def _local(value, replica):
    """Replica `replica`'s part of a structure that may hold PerReplica leaves."""
    if isinstance(value, PerReplica):
        return value.values[replica]
    if isinstance(value, tuple):
        return tuple(_local(v, replica) for v in value)
    if isinstance(value, list):
        return [_local(v, replica) for v in value]
    if isinstance(value, dict):
        return {k: _local(v, replica) for k, v in value.items()}
    return value


class DistributedDataset:
    """A dataset whose global batches are split across the strategy's replicas (and, with
    several workers, across the workers as its auto-shard policy says)."""

    def __init__(self, strategy, dataset, per_replica=False):
        self._strategy = strategy
        self._dataset = dataset
        if per_replica:
            self._cpp = strategy._cpp.distribute_per_replica_dataset(dataset._cpp)
        else:
            self._cpp = strategy._cpp.distribute_dataset(dataset._cpp)

    def __iter__(self):
        return DistributedIterator(self)


class DistributedIterator(IteratorBase):
    """A pass over a DistributedDataset: each element a global batch split over the replicas
    (PerReplica parts; with one replica the batch itself)."""

    def __init__(self, dataset):
        self._dataset = dataset._dataset
        self._cpp = dataset._cpp.make_iterator(_next_pass(dataset))
        self._one = dataset._strategy._cpp.num_local_replicas == 1

    def __next__(self):
        elements = [self._dataset._element(parts) for parts in self._cpp.next()]
        return elements[0] if self._one else _regroup(elements)


class Strategy:
    """The base of dtrain's strategies: tf.distribute.Strategy."""

    def __init__(self, cpp):
        self._cpp = cpp
        self._models = weakref.WeakSet()  # made in this scope: built on their first call in run()
        self._pending = set()  # models unbuilt when the run under way started
        self._merged = set()  # (thread, model) pairs that took part in their model's build

    @property
    def num_replicas_in_sync(self):
        return self._cpp.num_replicas_in_sync

    @property
    def extended(self):
        return self

    @property
    def worker_devices(self):
        return tuple(self._cpp.devices)

    @property
    def cluster_resolver(self):
        return None

    def scope(self):
        """Models, layers, optimizers and variables made inside belong to this strategy."""
        return _scoped(self, _d._Scope(self._cpp.backend()))

    def run(self, fn, args=(), kwargs=None, options=None):
        """fn(*args, **kwargs) on every replica at once. PerReplica arguments (a distributed
        batch) are unwrapped, each replica taking its own; others go to every replica as
        they are. With one replica the result itself, else PerReplica results."""
        del options
        kwargs = kwargs or {}
        n = self._cpp.num_local_replicas
        per_args = [tuple(_local(a, r) for a in args) for r in range(n)]
        per_kwargs = [{k: _local(v, r) for k, v in kwargs.items()} for r in range(n)]
        self._pending = {m for m in self._models if not m.built}
        self._merged = set()
        try:
            results = self._cpp.run_replicas(fn, per_args, per_kwargs)
        finally:
            self._pending = set()
        return results[0] if n == 1 else _regroup(results)

    def _build_in_replica(self, model, build):
        """A model first called inside run(): every replica's first call meets the others in
        a merge_call, where replica 0 builds the shared weights (as TensorFlow creates
        variables in a replica context)."""
        if model not in self._pending or not _d._in_replica():
            return False
        key = (threading.get_ident(), id(model))
        if key not in self._merged:
            self._merged.add(key)
            _d._merge_call(build)
        return True

    def reduce(self, reduce_op, value, axis=None):
        """Combines a per-replica value (or a structure of them) with SUM or MEAN, over every
        replica of every worker; ``axis`` also reduces along that axis."""
        if isinstance(reduce_op, str):
            if reduce_op.upper() not in ("SUM", "MEAN"):
                raise ValueError(f"reduce: reduce_op must be SUM or MEAN (tf.distribute.ReduceOp), got {reduce_op!r}")
            reduce_op = ReduceOp.SUM if reduce_op.upper() == "SUM" else ReduceOp.MEAN
        elif not isinstance(reduce_op, ReduceOp):
            raise TypeError(f"reduce: reduce_op must be tf.distribute.ReduceOp.SUM or MEAN, got {reduce_op!r}")
        if isinstance(value, PerReplica):
            return self._cpp.reduce(reduce_op, list(value.values), axis)
        if isinstance(value, (tuple, list)):
            return type(value)(self.reduce(reduce_op, v, axis) for v in value)
        if isinstance(value, dict):
            return {k: self.reduce(reduce_op, v, axis) for k, v in value.items()}
        if value is None:
            return None
        # A plain value: one replica's (with several, dtrain says it is not per-replica).
        return self._cpp.reduce(reduce_op, [value], axis)

    def gather(self, value, axis=0):
        values = list(value.values) if isinstance(value, PerReplica) else [value]
        return self._cpp.gather(values, axis)

    def experimental_local_results(self, value):
        return value.values if isinstance(value, PerReplica) else (value,)

    def experimental_distribute_dataset(self, dataset, options=None):
        del options
        if not isinstance(dataset, Dataset):
            raise TypeError("experimental_distribute_dataset takes a tf.data.Dataset")
        return DistributedDataset(self, dataset)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        """dataset_fn(tf.distribute.InputContext) is called once in this worker and gives
        its pipeline, batched with the per-replica batch size
        (context.get_per_replica_batch_size(global)) and sharded as the function chooses
        (context.input_pipeline_id of num_input_pipelines); each step takes one element for
        each of this worker's replicas. dtrain shards nothing for it."""
        del options
        context = InputContext(self._cpp.num_workers, self._cpp.worker_index, self._cpp.num_replicas_in_sync)
        dataset = dataset_fn(context)
        if not isinstance(dataset, Dataset):
            raise TypeError(f"distribute_datasets_from_function: dataset_fn must return a tf.data.Dataset, got "
                            f"{type(dataset).__name__}")
        return DistributedDataset(self, dataset, per_replica=True)

    def experimental_distribute_values_from_function(self, value_fn):
        """value_fn(tf.distribute.experimental.ValueContext) for each of this worker's
        replicas: PerReplica values (with one replica, the value)."""
        local = self._cpp.num_local_replicas
        first = self._cpp.worker_index * local
        values = [value_fn(experimental.ValueContext(first + i, self._cpp.num_replicas_in_sync)) for i in range(local)]
        return values[0] if local == 1 else PerReplica(values)


class CrossDeviceOps:
    """How MirroredStrategy sums its replicas' values (tf.distribute.CrossDeviceOps). Replicas
    on GPUs of their own follow it: NcclAllReduce sums with NCCL where the machine has it,
    HierarchicalCopyAllReduce and ReductionToOneDevice on the first GPU. Replicas on CPUs sum
    in shared memory, and replicas on logical GPUs of one GPU on that GPU, whichever is given
    (NCCL refuses two ranks on one GPU)."""

    def __init__(self, num_packs=1):
        if int(num_packs) < 0:
            raise ValueError(f"{type(self).__name__}: num_packs must be >= 0, got {num_packs}")
        self.num_packs = int(num_packs)


class NcclAllReduce(CrossDeviceOps):
    pass


class HierarchicalCopyAllReduce(CrossDeviceOps):
    pass


class ReductionToOneDevice(CrossDeviceOps):
    def __init__(self, reduce_to_device=None, accumulation_fn=None):
        super().__init__()
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn


class MirroredStrategy(Strategy):
    """Synchronous replicas in this process. By default one per logical GPU where there are
    GPUs (as TensorFlow does: each GPU, or logical GPUs of one GPU split by
    tf.config.set_logical_device_configuration), else one per core; devices: "/cpu:0",
    "/cpu:1", ... (or their number), or "/gpu:0", "/gpu:1", ..."""

    def __init__(self, devices=None, cross_device_ops=None, communication_options=None):
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError("MirroredStrategy: cross_device_ops is a tf.distribute.CrossDeviceOps "
                            f"(NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice), got {cross_device_ops!r}")
        self.cross_device_ops = cross_device_ops
        if devices is None and _dtrain._logical_gpu_count() > 0:
            devices = [f"/gpu:{i}" for i in range(_dtrain._logical_gpu_count())]
        o = communication_options or experimental.CommunicationOptions()
        super().__init__(_d._MirroredStrategy(devices, o.bytes_per_pack, o.timeout_seconds or 0.0,
                                              type(cross_device_ops).__name__ if cross_device_ops else ""))


class OneDeviceStrategy(Strategy):
    def __init__(self, device="/cpu:0"):
        super().__init__(_d._OneDeviceStrategy(device))


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous replicas in several processes, which TF_CONFIG names; without TF_CONFIG
    one worker that trains at once. Each worker trains on its logical GPUs where it has GPUs,
    else on its CPU. Under `dtrain launch --workers MIN:MAX`, or with
    elastic=experimental.ElasticOptions(...), an elastic job: fit goes on when a worker is
    lost, and a worker that starts again joins (docs/cluster.md, "Elastic training")."""

    def __init__(self, cluster_resolver=None, communication_options=None, elastic=None):
        if isinstance(cluster_resolver, _resolvers._Resolved):
            if not isinstance(cluster_resolver, _resolvers.TFConfigClusterResolver):
                # Slurm's or Kubernetes' cluster: this process's TF_CONFIG, which the strategy reads.
                os.environ["TF_CONFIG"] = cluster_resolver._tf_config
        elif cluster_resolver is not None:
            raise TypeError("MultiWorkerMirroredStrategy: dtrain reads the cluster from TF_CONFIG or a scheduler "
                            "(cluster_resolver may be a TFConfigClusterResolver, SlurmClusterResolver or "
                            "KubernetesIndexedJobClusterResolver)")
        o = communication_options or experimental.CommunicationOptions()
        if elastic is not None:
            # An elastic job's worker (experimental.ElasticOptions); under `dtrain launch
            # --workers MIN:MAX` the strategy finds its own in the environment.
            if not isinstance(elastic, experimental.ElasticOptions):
                raise TypeError("MultiWorkerMirroredStrategy: elastic must be a "
                                "dtrain.distribute.experimental.ElasticOptions, got " + type(elastic).__name__)
            super().__init__(_d._MultiWorkerMirroredStrategy.elastic(
                elastic.min_workers, elastic.max_workers, elastic.store, elastic.id, elastic.token,
                elastic.commit_every, elastic.join_timeout_seconds, elastic.keep == "worker_batch", o.bytes_per_pack,
                o.timeout_seconds or 0.0, o.compression, o.implementation))
            self._resolver = cluster_resolver or _resolvers.TFConfigClusterResolver()
            return
        # As TensorFlow does, each worker trains on its logical GPUs where it has GPUs (its
        # sums with the other workers go through NCCL or pinned host memory: docs/gpu.md).
        gpus = [] if os.environ.get("DTRAIN_ELASTIC") else [f"/gpu:{i}" for i in range(_dtrain._logical_gpu_count())]
        super().__init__(_d._MultiWorkerMirroredStrategy(o.bytes_per_pack, o.timeout_seconds or 0.0, o.compression,
                                                         o.implementation, True, gpus))
        self._resolver = cluster_resolver or _resolvers.TFConfigClusterResolver()

    @property
    def cluster_resolver(self):
        return self._resolver


_default = None


def get_strategy():
    """The strategy whose scope is open, else the default strategy (one replica)."""
    global _default
    if _stack:
        return _stack[-1]
    if _default is None:
        _default = Strategy(_d._DefaultStrategy())
    return _default


def has_strategy():
    return bool(_stack)


def in_cross_replica_context():
    """False inside strategy.run's function on a replica's thread."""
    return not _d._in_replica()




class coordinator:  # noqa: N801 (TensorFlow's module name: tf.distribute.coordinator)
    ClusterCoordinator = ClusterCoordinator
    RemoteValue = RemoteValue
