"""tf.distribute.Server and tf.train.ClusterSpec: a worker or ps that runs no training
program of its own, as TensorFlow's parameter-server programs start them::

    server = tf.distribute.Server(cluster_spec, job_name="worker", task_index=0, protocol="grpc")
    server.join()

A ps serves its variables. A worker loads the program the chief ships with its closures:
the chief's models (as their Keras JSON, built under the worker's strategy scope), its
per-worker dataset functions, its scheduled functions and its model.fit's input, all
pickled by value (cloudpickle) so that the worker needs no copy of the chief's program. The
models, the strategy and the coordinator a function refers to become the worker's own;
optimizers and losses travel as their Keras JSON. A program that every task runs (the
same-program way) keeps working: its workers define what they run themselves.
"""
import io
import json
import pickle
import sys

import cloudpickle

from .. import _dtrain

_d = _dtrain.distribute


class ClusterSpec:
    """tf.train.ClusterSpec: each job's task addresses ("host:port")."""

    def __init__(self, cluster):
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if not isinstance(cluster, dict):
            raise TypeError(f"ClusterSpec takes a dict of job name to addresses, got {type(cluster).__name__}")
        self._cluster = {}
        for job, tasks in cluster.items():
            if isinstance(tasks, dict):  # {index: address}, as TensorFlow also takes
                tasks = [tasks[i] for i in sorted(tasks)]
            self._cluster[str(job)] = [str(a) for a in tasks]

    def as_dict(self):
        return {job: list(tasks) for job, tasks in self._cluster.items()}

    @property
    def jobs(self):
        return list(self._cluster)

    def num_tasks(self, job_name):
        return len(self._cluster.get(job_name, []))

    def task_address(self, job_name, task_index):
        return self._cluster[job_name][task_index]

    def job_tasks(self, job_name):
        return list(self._cluster[job_name])

    def __bool__(self):
        return bool(self._cluster)

    def __eq__(self, other):
        return isinstance(other, ClusterSpec) and self._cluster == other._cluster

    def __repr__(self):
        return f"ClusterSpec({self._cluster!r})"


def _tf_config(cluster_spec, task_type, task_id):
    cluster = ClusterSpec(cluster_spec).as_dict()
    if "chief" not in cluster:
        raise ValueError("ParameterServerStrategy: the cluster spec names no 'chief' task; dtrain's workers and ps "
                         "answer the chief's address only (give the coordinator's host:port as the 'chief' job)")
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": int(task_id)}})


class Server:
    """A worker or ps of a ParameterServerStrategy job; join() serves until the chief ends
    the job. protocol "grpc" only; config (a ConfigProto) is not used."""

    def __init__(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None, config=None, start=True):
        del config
        if protocol not in (None, "grpc"):
            raise ValueError(f"tf.distribute.Server: protocol '{protocol}' is not one dtrain has (grpc)")
        if job_name not in ("worker", "ps"):
            raise ValueError(f"tf.distribute.Server: job_name must be 'worker' or 'ps' (the chief runs the training "
                             f"program with ParameterServerStrategy), got {job_name!r}")
        self._spec = ClusterSpec(server_or_cluster_def)
        self._job = job_name
        self._index = 0 if task_index is None else int(task_index)
        if not 0 <= self._index < self._spec.num_tasks(job_name):
            raise ValueError(f"tf.distribute.Server: the cluster spec has {self._spec.num_tasks(job_name)} "
                             f"'{job_name}' task(s); task_index {self._index} is not one of them")
        self._started = bool(start)

    @property
    def target(self):
        return "grpc://" + self._spec.task_address(self._job, self._index)

    def start(self):
        self._started = True

    def join(self):
        """Serves the chief until it ends the job, then returns."""
        from .parameter_server import ClusterCoordinator, ParameterServerStrategy

        self._started = True
        strategy = ParameterServerStrategy._for_task(_tf_config(self._spec, self._job, self._index))
        coordinator = ClusterCoordinator(strategy)
        if self._job == "ps":
            coordinator._cpp.serve()
            return
        coordinator._cpp.serve_programs(_Loader(strategy, coordinator))
        sys.stdout.flush()


# ---------------------------------------------------------------- the chief's program

class _Pickler(cloudpickle.Pickler):
    """Pickles by value, leaving the chief's models, strategy and coordinator as references
    the worker resolves to its own."""

    def __init__(self, file, program):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._program = program

    def persistent_id(self, obj):
        from ..keras.models import Model
        from .parameter_server import ClusterCoordinator, ParameterServerStrategy

        if isinstance(obj, Model):
            return ("model", self._program.model_key(obj))
        if isinstance(obj, ParameterServerStrategy):
            return ("strategy",)
        if isinstance(obj, ClusterCoordinator):
            return ("coordinator",)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, loader):
        super().__init__(file)
        self._loader = loader

    def persistent_load(self, pid):
        if pid[0] == "model":
            return self._loader.models[pid[1]]
        if pid[0] == "strategy":
            return self._loader.strategy
        if pid[0] == "coordinator":
            return self._loader.coordinator
        raise pickle.UnpicklingError(f"the chief's program refers to an unknown object {pid!r}")


class _Program:
    """The chief's: what a worker that loads programs needs, each entry pickled once, sent
    whole (as a new version) whenever an entry is added."""

    def __init__(self, strategy):
        self._strategy = strategy
        self._entries = []
        self._error = ""

    def model_key(self, model):
        for k, m in enumerate(self._strategy._models):
            if m is model:
                return k
        raise pickle.PicklingError(f"model '{model.name}' was not made under this ParameterServerStrategy's scope")

    def add(self, what, entry, coordinator_cpp):
        if not self._error:
            try:
                buffer = io.BytesIO()
                _Pickler(buffer, self).dump(entry)
                self._entries.append(buffer.getvalue())
            except Exception as e:  # noqa: BLE001 (said to the workers that need it)
                self._error = (f"{what} cannot be sent to it: {type(e).__name__}: {e} (a worker that runs no "
                               f"program gets the chief's functions pickled by value; run the same program on every "
                               f"task instead, or keep what they use picklable)")
        self.ship(coordinator_cpp)

    def ship(self, coordinator_cpp):
        models = []
        if not self._error:
            try:
                models = self._models()
            except Exception as e:  # noqa: BLE001
                self._error = str(e)
        coordinator_cpp.ship(pickle.dumps({"partitioner": self._strategy._partitioner, "models": models,
                                           "entries": self._entries}), self._error)

    def _models(self):
        """Each built model as (key, Keras JSON), in the order the chief made their variables."""
        order = {name: i for i, (name, _, _, _) in enumerate(self._strategy._cpp.placement())}
        made = []
        for k, model in enumerate(self._strategy._models):
            if model._cpp is None or not model.built:
                continue
            if model._own:
                raise ValueError(f"model '{model.name}' is a subclassed Model, which has no JSON for the workers "
                                 f"to build it from; run the same program on every task instead")
            first = min((order.get(v.name, len(order)) for v in model.variables), default=len(order))
            made.append((first, k, model.to_json()))
        return [(k, text) for _, k, text in sorted(made)]


class _Loader:
    """A worker's: builds the chief's models under its strategy's scope, then runs each new
    entry of the program (defines functions and datasets, or serves a fit)."""

    def __init__(self, strategy, coordinator):
        self.strategy = strategy
        self.coordinator = coordinator
        self.models = {}
        self._loaded = 0

    def __call__(self, blob):
        from ..keras import models as keras_models

        program = pickle.loads(blob)
        if program["partitioner"] is not None and not self.models:  # the chief's shards, before any variable
            self.strategy._partitioner = program["partitioner"]
            self.strategy._cpp.set_partitioner(program["partitioner"]._cpp)
        for key, text in program["models"]:
            if key not in self.models:
                with self.strategy.scope():
                    model = keras_models.model_from_json(text)
                    model._model()
                self.models[key] = model
        entries = program["entries"]
        while self._loaded < len(entries):
            entry = _Unpickler(io.BytesIO(entries[self._loaded]), self).load()
            self._loaded += 1  # first: a fit serves on inside _run, and later versions load there
            self._run(entry)

    def _run(self, entry):
        kind = entry[0]
        if kind == "function":
            _, name, fn, takes_iterator = entry
            self.coordinator._define_as(name, fn, takes_iterator)
        elif kind == "dataset":
            self.coordinator.create_per_worker_dataset(entry[1])
        elif kind == "fit":
            from ..keras import utils

            _, model, compile_args, fit_args = entry
            optimizer, loss, metrics, steps_per_execution, loss_weights = compile_args
            model.compile(optimizer=optimizer, loss=loss, metrics=metrics, steps_per_execution=steps_per_execution,
                          loss_weights=loss_weights)
            utils.set_random_seed(fit_args.pop("seed"))
            model.fit(verbose=0, **fit_args)
        else:
            raise ValueError(f"the chief's program has an entry of unknown kind {kind!r}")
