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


from . import partitioners  # noqa: E402,F401 (tf.distribute.experimental.partitioners)


class coordinator:  # noqa: N801 (TensorFlow's module name)
    from .parameter_server import ClusterCoordinator, RemoteValue  # noqa: F401


from .parameter_server import ParameterServerStrategy  # noqa: E402,F401
