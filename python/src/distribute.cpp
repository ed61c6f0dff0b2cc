// tf.distribute: the strategies, their scope, strategy.run over Python functions, reduce,
// and distributed datasets. A Python step function runs on every replica's thread, each
// taking the GIL for its Python and releasing it inside every dtrain call, so the replicas'
// kernels (and their cross-replica waits) run side by side while their Python takes turns.
#include <pybind11/stl.h>

#include <numeric>

#include "bindings.h"
#include "dtrain/cli/strategy_flags.h"

namespace dtrain::python {
namespace {

using distribute::Strategy;

// `with strategy.scope():` as an object: entered and left from Python.
class Scope {
 public:
  explicit Scope(std::shared_ptr<StrategyBackend> backend) : backend_(std::move(backend)) {}
  void enter() {
    if (scoped_) throw py::value_error("strategy.scope(): this scope was entered already");
    scoped_.emplace(backend_);
  }
  void exit() { scoped_.reset(); }

 private:
  std::shared_ptr<StrategyBackend> backend_;
  std::optional<dtrain::detail::ScopedStrategy> scoped_;
};

// Calls fn with the GIL, from a thread that does not hold it (a replica's). A Python
// exception is kept in `error`, to be raised as itself once the GIL is back with the
// caller, and thrown on as a dtrain Error so that replicas waiting for this one are released.
template <typename Fn>
void call_python(Fn&& fn, std::unique_ptr<py::error_already_set>& error) {
  py::gil_scoped_acquire gil;
  try {
    fn();
  } catch (py::error_already_set& e) {
    const std::string message = e.what();
    error = std::make_unique<py::error_already_set>(std::move(e));
    throw Error(message);
  }
}

// fn(*args[r], **kwargs[r]) on each replica r at once; their results, in replica order.
// A Python exception in any replica is raised as itself once every replica returned: the
// first replica's own, before the PeerFailure of those it left waiting.
py::list run_replicas(const Strategy& strategy, const py::function& fn, const py::list& args, const py::list& kwargs) {
  const int n = strategy.num_local_replicas();
  if (static_cast<int>(args.size()) != n || static_cast<int>(kwargs.size()) != n)
    throw py::value_error("strategy.run: arguments for " + std::to_string(args.size()) + " replicas where there are " +
                          std::to_string(n));
  std::vector<PyObject*> results(static_cast<std::size_t>(n), nullptr);
  std::vector<std::unique_ptr<py::error_already_set>> errors(static_cast<std::size_t>(n));
  std::vector<int> replicas(static_cast<std::size_t>(n));
  std::iota(replicas.begin(), replicas.end(), 0);
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      strategy.run([&](const int& r) {
        const auto i = static_cast<std::size_t>(r);
        call_python([&] { results[i] = fn(*py::tuple(args[i]), **py::dict(kwargs[i])).release().ptr(); }, errors[i]);
      }, distribute::PerReplica<int>(replicas));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  py::list out;
  for (PyObject* r : results) {
    py::object value = r ? py::reinterpret_steal<py::object>(r) : py::none();
    out.append(value);
  }
  if (failure) {
    // The replica whose own error failed the run: the others' PeerFailure follows from it.
    const py::object peer_failure = py::module_::import("dtrain._dtrain").attr("errors").attr("PeerFailureError");
    for (auto& e : errors)
      if (e && !e->matches(peer_failure)) throw *e;
    for (auto& e : errors)
      if (e) throw *e;
    std::rethrow_exception(failure);
  }
  return out;
}

distribute::PerReplica<Tensor> per_replica(const py::list& values, const char* what) {
  std::vector<Tensor> ts;
  for (py::handle v : values) ts.push_back(to_tensor(v, what));
  return distribute::PerReplica<Tensor>(std::move(ts));
}


// The iterator a closure's function gets on a worker: the per-worker dataset's, owned there.
class BorrowedIterator {
 public:
  explicit BorrowedIterator(data::Iterator& it) : it_(&it) {}
  py::list next() { return next_components(*it_); }

 private:
  data::Iterator* it_;
};

// A Python step function's results as the tensors a closure carries back: a tensor, a
// number, or a tuple or list of them (None: nothing).
std::vector<Tensor> closure_results(const py::object& out) {
  std::vector<Tensor> results;
  if (out.is_none()) return results;
  if (py::isinstance<py::tuple>(out) || py::isinstance<py::list>(out)) {
    for (py::handle v : out) results.push_back(to_tensor(v, "a scheduled function's result"));
  } else {
    results.push_back(to_tensor(out, "a scheduled function's result"));
  }
  return results;
}

class PyDistributedIterator {
 public:
  explicit PyDistributedIterator(distribute::DistributedDataset::Iterator it) : it_(std::move(it)) {}
  ~PyDistributedIterator() {
    py::gil_scoped_release release;
    it_.reset();
  }
  PyDistributedIterator(const PyDistributedIterator&) = delete;
  PyDistributedIterator& operator=(const PyDistributedIterator&) = delete;
  // [replica][component]
  py::list next() {
    std::optional<distribute::PerReplica<data::Element>> batch;
    {
      py::gil_scoped_release release;
      batch = it_->next();
    }
    if (!batch) throw py::stop_iteration();
    py::list out;
    for (const data::Element& e : batch->values()) {
      py::list parts;
      for (const Tensor& t : e) parts.append(py::cast(t));
      out.append(parts);
    }
    return out;
  }

 private:
  std::optional<distribute::DistributedDataset::Iterator> it_;
};

distribute::CommunicationOptions communication(std::size_t bytes_per_pack, double timeout_seconds,
                                               const std::string& compression, const std::string& implementation) {
  distribute::CommunicationOptions o;
  o.bytes_per_pack = bytes_per_pack;
  o.timeout_seconds = timeout_seconds;
  if (compression == "none" || compression.empty()) o.compression = distribute::Compression::NONE;
  else if (compression == "bf16") o.compression = distribute::Compression::BF16;
  else if (compression == "fp16") o.compression = distribute::Compression::FP16;
  else throw py::value_error("CommunicationOptions: compression is 'none', 'bf16' or 'fp16', got '" + compression + "'");
  if (implementation == "auto" || implementation.empty()) o.implementation = distribute::CommunicationImplementation::AUTO;
  else if (implementation == "ring") o.implementation = distribute::CommunicationImplementation::RING;
  else throw py::value_error("CommunicationOptions: implementation is 'auto' or 'ring', got '" + implementation + "'");
  return o;
}

}  // namespace

void bind_distribute(py::module_& m) {
  py::module_ d = m.def_submodule("distribute", "tf.distribute's strategies");
  py::enum_<distribute::ReduceOp>(d, "ReduceOp")
      .value("SUM", distribute::ReduceOp::SUM)
      .value("MEAN", distribute::ReduceOp::MEAN);

  py::class_<StrategyBackend, std::shared_ptr<StrategyBackend>>(d, "_Backend")
      .def_property_readonly("name", &StrategyBackend::name)
      .def_property_readonly("num_replicas", &StrategyBackend::num_replicas);
  // The cluster resolvers (cluster/resolvers.h) over a given environment: the task's
  // TF_CONFIG JSON and its GPUs (CUDA_VISIBLE_DEVICES).
  auto environment_of = [](std::map<std::string, std::string> vars) -> cluster::Environment {
    return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
      const auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  d.def("_resolve_slurm", [environment_of](cluster::Jobs jobs, int port_base, std::map<std::string, std::string> env) {
    const cluster::Resolved r = cluster::resolve_slurm({std::move(jobs), port_base}, environment_of(std::move(env)));
    return std::make_pair(cluster::to_tf_config_json(r.config), r.devices);
  });
  d.def("_resolve_k8s_indexed_job", [environment_of](std::string service, std::string job_name, int num_tasks,
                                                     cluster::Jobs jobs, int port,
                                                     std::map<std::string, std::string> env) {
    const cluster::Resolved r = cluster::resolve_k8s_indexed_job(
        {std::move(service), std::move(job_name), num_tasks, std::move(jobs), port}, environment_of(std::move(env)));
    return std::make_pair(cluster::to_tf_config_json(r.config), r.devices);
  });
  d.def("_current_backend", &current_strategy);
  d.def("_in_replica", [] { return replica_context().cross != nullptr; });
  // TensorFlow's merge_call: every replica calls it; fn runs once, on replica 0, outside
  // the replica context (where a model can build its shared weights), while the others wait.
  d.def("_merge_call", [](py::function fn) {
    CrossReplica* cross = replica_context().cross;
    if (!cross) return void(fn());
    std::unique_ptr<py::error_already_set> error;
    try {
      py::gil_scoped_release release;
      cross->merge_call([&] { call_python([&] { fn(); }, error); });
    } catch (const Error&) {
      if (error) throw *error;
      throw;
    }
  });
  py::class_<Scope>(d, "_Scope")
      .def(py::init<std::shared_ptr<StrategyBackend>>())
      .def("enter", &Scope::enter)
      .def("exit", &Scope::exit);

  py::class_<PyDistributedIterator>(d, "_DistributedIterator").def("next", &PyDistributedIterator::next);
  py::class_<distribute::DistributedDataset>(d, "_DistributedDataset")
      .def_property_readonly("num_replicas", &distribute::DistributedDataset::num_replicas)
      .def("make_iterator", [](const distribute::DistributedDataset& ds, std::uint64_t iteration) {
        py::gil_scoped_release release;
        return std::make_unique<PyDistributedIterator>(ds.make_iterator(iteration));
      }, py::arg("iteration") = 0);

  py::class_<Strategy, std::shared_ptr<Strategy>>(d, "_Strategy")
      .def_property_readonly("num_replicas_in_sync", &Strategy::num_replicas_in_sync)
      .def_property_readonly("name", &Strategy::name)
      .def_property_readonly("devices", &Strategy::devices)
      .def_property_readonly("num_local_replicas", &Strategy::num_local_replicas)
      .def_property_readonly("num_workers", &Strategy::num_workers)
      .def_property_readonly("worker_index", &Strategy::worker_index)
      .def_property_readonly("threads_per_replica", &Strategy::threads_per_replica)
      .def("backend", &Strategy::backend)
      .def("run_replicas", &run_replicas)
      .def("reduce", [](const Strategy& s, distribute::ReduceOp op, const py::list& values, std::optional<int> axis) {
        const distribute::PerReplica<Tensor> v = per_replica(values, "strategy.reduce");
        py::gil_scoped_release release;
        return s.reduce(op, v, axis);
      }, py::arg("op"), py::arg("values"), py::arg("axis") = py::none())
      .def("gather", [](const Strategy& s, const py::list& values, int axis) {
        const distribute::PerReplica<Tensor> v = per_replica(values, "strategy.gather");
        py::gil_scoped_release release;
        return s.gather(v, axis);
      }, py::arg("values"), py::arg("axis") = 0)
      .def("distribute_dataset", [](const Strategy& s, const data::Dataset& ds) {
        return s.experimental_distribute_dataset(ds);
      })
      // The dataset distribute_datasets_from_function's function gave (called in Python).
      .def("distribute_per_replica_dataset", [](const Strategy& s, const data::Dataset& ds) {
        return s.distribute_datasets_from_function([&](const distribute::InputContext&) { return ds; });
      });
  // ParameterServerStrategy and ClusterCoordinator.
  py::class_<distribute::ParameterServerStrategy, std::shared_ptr<distribute::ParameterServerStrategy>>(
      d, "_ParameterServerStrategy")
      .def(py::init([](const std::string& consistency, double rpc_timeout_seconds,
                       std::optional<distribute::Partitioner> partitioner, const std::string& tf_config) {
             distribute::ParameterServerOptions o;
             o.consistency = cli::parse_consistency(consistency);  // as the command's --consistency
             o.rpc_timeout_seconds = rpc_timeout_seconds;
             if (partitioner) o.variable_partitioner = *partitioner;
             // tf_config: a cluster and task given in Python (a ClusterSpec), in TF_CONFIG's form.
             const cluster::TfConfig config = tf_config.empty() ? cluster::tf_config_from_environment()
                                                                : cluster::parse_tf_config(tf_config, "the cluster spec");
             py::gil_scoped_release release;
             return std::make_shared<distribute::ParameterServerStrategy>(config, o);
           }),
           py::arg("consistency") = "async", py::arg("rpc_timeout_seconds") = 0.0, py::arg("partitioner") = py::none(),
           py::arg("tf_config") = "")
      .def_property_readonly("task_type", [](const distribute::ParameterServerStrategy& s) { return s.task().type; })
      .def_property_readonly("task_id", [](const distribute::ParameterServerStrategy& s) { return s.task().index; })
      .def_property_readonly("is_chief", &distribute::ParameterServerStrategy::is_chief)
      .def_property_readonly("num_workers", &distribute::ParameterServerStrategy::num_workers)
      .def_property_readonly("num_ps", &distribute::ParameterServerStrategy::num_ps)
      .def("end_job", &distribute::ParameterServerStrategy::end_job, py::call_guard<py::gil_scoped_release>())
      .def("set_partitioner", [](distribute::ParameterServerStrategy& s, const distribute::Partitioner& p) {
        s.set_variable_partitioner(p);
      })
      // (variable, shard, shards, ps task) of each shard placed so far.
      .def("placement", [](const distribute::ParameterServerStrategy& s) {
        std::vector<std::tuple<std::string, std::int64_t, std::int64_t, int>> out;
        for (const distribute::ShardPlacement& p : s.placement()) out.emplace_back(p.variable, p.shard, p.num_shards, p.ps);
        return out;
      });
  // tf.distribute.experimental.partitioners' rules (ps/partitioner.h).
  py::class_<distribute::Partitioner>(d, "_Partitioner")
      .def_static("fixed_shards", &distribute::FixedShardsPartitioner, py::arg("num_shards"))
      .def_static("min_size", &distribute::MinSizePartitioner, py::arg("min_shard_bytes"), py::arg("max_shards"))
      .def_static("max_size", &distribute::MaxSizePartitioner, py::arg("max_shard_bytes"), py::arg("max_shards"))
      .def("num_shards", [](const distribute::Partitioner& p, std::vector<std::int64_t> shape, const std::string& dtype) {
        return p.num_shards(Shape(shape), dtype_from_name(dtype, "partitioner dtype"));
      })
      .def_property_readonly("description", &distribute::Partitioner::description);
  // The backend its scope opens (a _Scope then opens it as any strategy's).
  d.def("_ps_backend", [](const distribute::ParameterServerStrategy& s) {
    const auto scope = s.scope();
    return current_strategy();
  });
  py::class_<BorrowedIterator>(d, "_WorkerIterator").def("next", &BorrowedIterator::next);
  py::class_<distribute::RemoteFunction>(d, "_RemoteFunction")
      .def_readonly("name", &distribute::RemoteFunction::name);
  py::class_<distribute::PerWorkerIterator>(d, "_PerWorkerIterator");
  py::class_<distribute::PerWorkerDataset>(d, "_PerWorkerDataset")
      .def("iterator", &distribute::PerWorkerDataset::iterator);
  py::class_<distribute::RemoteValue>(d, "_RemoteValue")
      .def("fetch", [](const distribute::RemoteValue& v) {
        std::vector<Tensor> out;
        {
          py::gil_scoped_release release;
          out = v.fetch();
        }
        return out;
      })
      .def("done", &distribute::RemoteValue::done);
  py::class_<distribute::ClusterCoordinator, std::shared_ptr<distribute::ClusterCoordinator>>(d, "_ClusterCoordinator")
      .def(py::init([](std::shared_ptr<distribute::ParameterServerStrategy> s) {
             // Kept alive by the coordinator object: it is a handle on the strategy's runtime.
             return std::make_shared<distribute::ClusterCoordinator>(*s);
           }),
           py::keep_alive<1, 2>())
      .def("define_iterator_function", [](distribute::ClusterCoordinator& c, const std::string& name, py::function fn) {
        auto f = hold(std::move(fn));
        return c.define(name, distribute::ClusterCoordinator::IteratorFunction([f](data::Iterator& it) {
          py::gil_scoped_acquire gil;
          return closure_results((*f)(py::cast(BorrowedIterator(it))));
        }));
      })
      .def("define_function", [](distribute::ClusterCoordinator& c, const std::string& name, py::function fn) {
        auto f = hold(std::move(fn));
        return c.define(name, distribute::ClusterCoordinator::PlainFunction([f] {
          py::gil_scoped_acquire gil;
          return closure_results((*f)());
        }));
      })
      .def("create_per_worker_dataset", [](distribute::ClusterCoordinator& c, py::function dataset_fn) {
        auto f = hold(std::move(dataset_fn));
        return c.create_per_worker_dataset([f] {
          py::gil_scoped_acquire gil;
          py::object ds = (*f)();
          if (py::hasattr(ds, "_cpp")) ds = ds.attr("_cpp");
          return ds.cast<data::Dataset>();
        });
      })
      .def("schedule", [](distribute::ClusterCoordinator& c, const distribute::RemoteFunction& fn) { return c.schedule(fn); })
      .def("schedule_with", [](distribute::ClusterCoordinator& c, const distribute::RemoteFunction& fn,
                               const distribute::PerWorkerIterator& it) { return c.schedule(fn, it); })
      .def("join", &distribute::ClusterCoordinator::join, py::call_guard<py::gil_scoped_release>())
      .def("done", &distribute::ClusterCoordinator::done)
      .def("serve", py::overload_cast<>(&distribute::ClusterCoordinator::serve), py::call_guard<py::gil_scoped_release>())
      // tf.distribute.Server(...).join() on a worker: `load(bytes)` runs the chief's program.
      .def("serve_programs", [](distribute::ClusterCoordinator& c, py::function load) {
        auto f = hold(std::move(load));
        py::gil_scoped_release release;
        c.serve([f](const std::string& bytes) {
          py::gil_scoped_acquire gil;
          try {
            (*f)(py::bytes(bytes));
          } catch (py::error_already_set& e) {
            // Made into dtrain's error here, under the GIL: the Python exception stays behind.
            DTRAIN_THROW(InvalidArgument, e.what());
          }
        });
      })
      .def("ship", [](distribute::ClusterCoordinator& c, py::bytes program, const std::string& error) {
        std::string bytes = program;
        py::gil_scoped_release release;
        c.ship(std::move(bytes), error);
      }, py::arg("program"), py::arg("error") = "");

  py::class_<distribute::DefaultStrategy, Strategy, std::shared_ptr<distribute::DefaultStrategy>>(d, "_DefaultStrategy")
      .def(py::init<>());
  py::class_<distribute::OneDeviceStrategy, Strategy, std::shared_ptr<distribute::OneDeviceStrategy>>(d, "_OneDeviceStrategy")
      .def(py::init<const std::string&>(), py::arg("device") = "/cpu:0");
  py::class_<distribute::MirroredStrategy, Strategy, std::shared_ptr<distribute::MirroredStrategy>>(d, "_MirroredStrategy")
      .def(py::init([](py::object devices, std::size_t bytes_per_pack, double timeout_seconds,
                       const std::string& cross_device_ops) {
             distribute::CommunicationOptions o = communication(bytes_per_pack, timeout_seconds, "", "");
             // tf.distribute's class names; GPUs with memories of their own follow them.
             if (cross_device_ops == "NcclAllReduce") o.cross_device_ops = distribute::CrossDeviceOps::NCCL_ALL_REDUCE;
             else if (cross_device_ops == "HierarchicalCopyAllReduce")
               o.cross_device_ops = distribute::CrossDeviceOps::HIERARCHICAL_COPY;
             else if (cross_device_ops == "ReductionToOneDevice")
               o.cross_device_ops = distribute::CrossDeviceOps::REDUCTION_TO_ONE_DEVICE;
             if (devices.is_none()) {  // one replica per core
               if (bytes_per_pack == 0 && timeout_seconds == 0) return std::make_shared<distribute::MirroredStrategy>();
               return std::make_shared<distribute::MirroredStrategy>(num_threads(), o);
             }
             if (py::isinstance<py::int_>(devices))
               return std::make_shared<distribute::MirroredStrategy>(devices.cast<int>(), o);
             std::vector<std::string> names;
             for (py::handle device : devices) {
               if (!py::isinstance<py::str>(device))
                 throw py::type_error("MirroredStrategy: devices are names such as '/cpu:0', got " +
                                      py::repr(device).cast<std::string>());
               names.push_back(device.cast<std::string>());
             }
             return std::make_shared<distribute::MirroredStrategy>(names, o);
           }),
           py::arg("devices") = py::none(), py::arg("bytes_per_pack") = 0, py::arg("timeout_seconds") = 0.0,
           py::arg("cross_device_ops") = "");
  py::class_<distribute::MultiWorkerMirroredStrategy, Strategy, std::shared_ptr<distribute::MultiWorkerMirroredStrategy>>(
      d, "_MultiWorkerMirroredStrategy")
      .def(py::init([](std::size_t bytes_per_pack, double timeout_seconds, const std::string& compression,
                       const std::string& implementation, bool overlap, const std::vector<std::string>& devices) {
             distribute::CommunicationOptions o = communication(bytes_per_pack, timeout_seconds, compression, implementation);
             o.overlap = overlap;
             py::gil_scoped_release release;  // joining waits for the other workers
             if (devices.empty()) return std::make_shared<distribute::MultiWorkerMirroredStrategy>(o);
             // Each worker's replicas on these devices (its logical GPUs).
             if (const auto elastic = distribute::elastic_from_environment())
               return std::make_shared<distribute::MultiWorkerMirroredStrategy>(*elastic, o, devices);
             return std::make_shared<distribute::MultiWorkerMirroredStrategy>(cluster::tf_config_from_environment(), o,
                                                                              devices);
           }),
           py::arg("bytes_per_pack") = 0, py::arg("timeout_seconds") = 0.0, py::arg("compression") = "none",
           py::arg("implementation") = "auto", py::arg("overlap") = true,
           py::arg("devices") = std::vector<std::string>{})
      .def_static(
          "elastic",
          [](int min_workers, int max_workers, const std::string& store, const std::string& id, const std::string& token,
             std::int64_t commit_every, double join_timeout_seconds, bool keep_worker_batch, std::size_t bytes_per_pack,
             double timeout_seconds,
             const std::string& compression, const std::string& implementation) {
            distribute::ElasticJob job;
            job.min_workers = min_workers;
            job.max_workers = max_workers;
            job.store = store;
            job.id = id;
            job.token = token;
            job.commit_every = commit_every;
            job.join_timeout_seconds = join_timeout_seconds;
            job.keep_worker_batch = keep_worker_batch;
            const distribute::CommunicationOptions o =
                communication(bytes_per_pack, timeout_seconds, compression, implementation);
            py::gil_scoped_release release;  // joining waits for the other workers
            return std::make_shared<distribute::MultiWorkerMirroredStrategy>(job, o);
          },
          py::arg("min_workers"), py::arg("max_workers"), py::arg("store"), py::arg("id"), py::arg("token"),
          py::arg("commit_every"), py::arg("join_timeout_seconds"), py::arg("keep_worker_batch"), py::arg("bytes_per_pack"),
          py::arg("timeout_seconds"), py::arg("compression"), py::arg("implementation"))
      .def_property_readonly("task_type", &distribute::MultiWorkerMirroredStrategy::task_type)
      .def_property_readonly("task_id", &distribute::MultiWorkerMirroredStrategy::task_id)
      .def_property_readonly("is_chief", &distribute::MultiWorkerMirroredStrategy::is_chief);
}

}  // namespace dtrain::python
