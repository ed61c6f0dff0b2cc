"""tf.distribute.cluster_resolver: the cluster TF_CONFIG describes."""
import json
import os


class TFConfigClusterResolver:
    """Reads TF_CONFIG: the cluster's tasks and this process's task."""

    def __init__(self):
        text = os.environ.get("TF_CONFIG", "")
        try:
            self._config = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"TF_CONFIG is not JSON: {e}") from None

    def cluster_spec(self):
        from .server import ClusterSpec

        return ClusterSpec(self._config.get("cluster", {}))

    @property
    def rpc_layer(self):
        return self._config.get("rpc_layer")

    @property
    def task_type(self):
        return self._config.get("task", {}).get("type")

    @property
    def task_id(self):
        return self._config.get("task", {}).get("index")

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        del task_type, task_id, config_proto
        return {}


class SimpleClusterResolver:
    """A cluster given in Python: its ClusterSpec (or dict), and this process's task."""

    def __init__(self, cluster_spec, master="", task_type=None, task_id=None, environment="",
                 num_accelerators=None, rpc_layer=None):
        from .server import ClusterSpec

        del master, environment, num_accelerators
        self._spec = ClusterSpec(cluster_spec)
        self.task_type = task_type
        self.task_id = task_id
        self.rpc_layer = rpc_layer

    def cluster_spec(self):
        return self._spec

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        del task_type, task_id, config_proto
        return {}
