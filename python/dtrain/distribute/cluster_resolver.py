"""tf.distribute.cluster_resolver: the cluster TF_CONFIG describes, or Slurm's job step, or
a Kubernetes indexed Job (the resolvers of dtrain's C++ side, cluster/resolvers.h)."""
import json
import os

from .. import _dtrain


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


class _Resolved:
    """A resolver that stands for a TF_CONFIG: its cluster and this process's task."""

    def __init__(self, tf_config, devices, rpc_layer):
        self._config = json.loads(tf_config)
        self._tf_config = tf_config
        self._devices = devices
        self.rpc_layer = rpc_layer

    def cluster_spec(self):
        from .server import ClusterSpec

        return ClusterSpec(self._config.get("cluster", {}))

    @property
    def task_type(self):
        return self._config.get("task", {}).get("type")

    @property
    def task_id(self):
        return self._config.get("task", {}).get("index")

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        address = self._config["cluster"][task_type][task_id]
        layer = rpc_layer or self.rpc_layer
        return f"{layer}://{address}" if layer else address

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        del task_type, task_id, config_proto
        gpus = [d for d in self._devices.split(",") if d.strip()]
        return {"GPU": len(gpus)} if gpus else {}


class TFConfigClusterResolver(_Resolved):
    """Reads TF_CONFIG: the cluster's tasks and this process's task."""

    def __init__(self):
        text = os.environ.get("TF_CONFIG", "")
        try:
            config = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"TF_CONFIG is not JSON: {e}") from None
        super().__init__(json.dumps(config), "", config.get("rpc_layer"))


def _jobs(jobs, who):
    if jobs is None:
        return []
    if not isinstance(jobs, dict):
        raise TypeError(f"{who}: jobs is a dict of job names and task counts, e.g. {{'ps': 1, 'worker': 2}}")
    return [(str(name), int(count)) for name, count in jobs.items()]


class SlurmClusterResolver(_Resolved):
    """TensorFlow's SlurmClusterResolver: the cluster of a Slurm job step from the variables
    srun sets (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST,
    SLURM_STEP_TASKS_PER_NODE). `jobs` gives the ranks out in its order ({'chief': 1, 'ps':
    1, 'worker': 2}); without it every task is a worker. The tasks of a host listen on
    port_base, port_base + 1, ... GPUs: CUDA_VISIBLE_DEVICES, as Slurm sets it."""

    def __init__(self, jobs=None, port_base=8888, gpus_per_node=None, gpus_per_task=None, tasks_per_node=None,
                 auto_set_gpu=True, rpc_layer="grpc"):
        del gpus_per_node, gpus_per_task, tasks_per_node, auto_set_gpu
        tf_config, devices = _dtrain.distribute._resolve_slurm(_jobs(jobs, "SlurmClusterResolver"), int(port_base),
                                                               dict(os.environ))
        super().__init__(tf_config, devices, rpc_layer)


class KubernetesIndexedJobClusterResolver(_Resolved):
    """The cluster of a Kubernetes indexed Job whose pods are under a headless service:
    JOB_COMPLETION_INDEX is the task's rank, and pod i is <job>-i.<service> (the job's name
    from the hostname unless given). num_tasks: the Job's completions (else
    DTRAIN_NUM_TASKS); service: else DTRAIN_SERVICE. `jobs` gives the ranks out as the
    Slurm resolver does. (A Kubeflow TFJob sets TF_CONFIG: TFConfigClusterResolver reads it.)"""

    def __init__(self, service=None, num_tasks=None, jobs=None, port=2222, job_name=None, rpc_layer="grpc"):
        tf_config, devices = _dtrain.distribute._resolve_k8s_indexed_job(
            service or "", job_name or "", int(num_tasks or 0), _jobs(jobs, "KubernetesIndexedJobClusterResolver"),
            int(port), dict(os.environ))
        super().__init__(tf_config, devices, rpc_layer)
