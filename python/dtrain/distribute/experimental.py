"""tf.distribute.experimental: communication options."""


class CommunicationImplementation:
    AUTO = "auto"
    RING = "ring"
    NCCL = "nccl"


class CommunicationOptions:
    """bytes_per_pack (gradient buckets' size), timeout_seconds (any wait for another
    replica or worker), implementation (AUTO or RING); compression ('none', 'bf16',
    'fp16') is dtrain's own, for the buckets between workers."""

    def __init__(self, bytes_per_pack=0, timeout_seconds=None, implementation=CommunicationImplementation.AUTO,
                 compression="none"):
        if implementation == CommunicationImplementation.NCCL:
            raise ValueError("CommunicationOptions: NCCL needs GPUs, which this build of dtrain does not use")
        self.bytes_per_pack = int(bytes_per_pack)
        self.timeout_seconds = timeout_seconds
        self.implementation = implementation
        self.compression = compression


class ElasticOptions:
    """An elastic job's worker (MultiWorkerMirroredStrategy(elastic=...)), as `dtrain launch
    --workers MIN:MAX` describes it in each worker's environment (which the strategy reads
    by itself): the range of workers, the launcher's store ("host:port"), this worker's id
    ("worker:2"), the job's token (empty: DTRAIN_CLUSTER_TOKEN); commit_every batches
    between commits of the state in memory (0: as often as costs at most 5% of the time);
    join_timeout_seconds (0: the collective timeout); keep: "global_batch" (each global
    batch keeps its size when workers come and go) or "worker_batch" (each worker keeps
    its batch; the global batch and the learning rate follow the workers)."""

    def __init__(self, min_workers, max_workers, store, id, token="", commit_every=0,  # noqa: A002 (the worker's id)
                 join_timeout_seconds=0.0, keep="global_batch"):
        if keep not in ("global_batch", "worker_batch"):
            raise ValueError("ElasticOptions: keep must be 'global_batch' or 'worker_batch', got " + repr(keep))
        self.keep = keep
        self.min_workers = int(min_workers)
        self.max_workers = int(max_workers)
        self.store = str(store)
        self.id = str(id)
        self.token = str(token)
        self.commit_every = int(commit_every)
        self.join_timeout_seconds = float(join_timeout_seconds)


from . import partitioners  # noqa: E402,F401 (tf.distribute.experimental.partitioners)


class coordinator:  # noqa: N801 (TensorFlow's module name)
    from .parameter_server import ClusterCoordinator, RemoteValue  # noqa: F401


from .parameter_server import ParameterServerStrategy  # noqa: E402,F401


class ValueContext:
    """tf.distribute.experimental.ValueContext: which replica
    experimental_distribute_values_from_function's function is making a value for."""

    def __init__(self, replica_id_in_sync_group=0, num_replicas_in_sync=1):
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self):
        return (f"ValueContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
                f"num_replicas_in_sync={self.num_replicas_in_sync})")
