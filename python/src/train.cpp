// tf.train: Checkpoint and CheckpointManager over models, optimizers, variables and
// dataset iterators. The checkpoint keeps the Python objects it tracks alive.
#include <pybind11/stl.h>

#include "bindings.h"

namespace dtrain::python {
namespace {

class PyCheckpoint {
 public:
  // (name, object) pairs: a _Model, an Optimizer, a Variable or a dataset _Iterator.
  explicit PyCheckpoint(const py::list& objects) {
    std::vector<std::pair<std::string, train::Trackable>> tracked;
    for (py::handle item : objects) {
      py::tuple pair = py::reinterpret_borrow<py::tuple>(item);
      const std::string name = pair[0].cast<std::string>();
      py::object object = py::reinterpret_borrow<py::object>(pair[1]);
      if (py::isinstance<Model>(object)) {
        tracked.emplace_back(name, train::Trackable(object.cast<Model&>()));
      } else if (py::isinstance<optim::Optimizer>(object)) {
        tracked.emplace_back(name, train::Trackable(object.cast<optim::Optimizer&>()));
      } else if (py::isinstance<Variable>(object)) {
        tracked.emplace_back(name, train::Trackable(object.cast<Variable&>()));
      } else if (py::isinstance<PyIterator>(object)) {
        tracked.emplace_back(name, train::Trackable(object.cast<PyIterator&>().iterator()));
      } else {
        throw py::type_error("Checkpoint: '" + name + "' is a " +
                             py::str(py::type::handle_of(object).attr("__name__")).cast<std::string>() +
                             "; it tracks models, optimizers, variables and dataset iterators");
      }
      kept_.push_back(std::move(object));
    }
    checkpoint_ = std::make_unique<train::Checkpoint>(std::move(tracked));
  }
  train::Checkpoint& get() { return *checkpoint_; }

 private:
  std::vector<py::object> kept_;  // what the checkpoint refers to
  std::unique_ptr<train::Checkpoint> checkpoint_;
};

class PyManager {
 public:
  PyManager(py::object checkpoint, const std::string& directory, int max_to_keep, double every_n_hours,
            const std::string& name)
      : checkpoint_(std::move(checkpoint)) {
    train::CheckpointManagerOptions o;
    o.max_to_keep = max_to_keep;
    o.keep_checkpoint_every_n_hours = every_n_hours;
    o.checkpoint_name = name;
    manager_ = std::make_unique<train::CheckpointManager>(checkpoint_.cast<PyCheckpoint&>().get(), directory, o);
  }
  ~PyManager() {
    py::gil_scoped_release release;
    manager_.reset();
  }
  PyManager(const PyManager&) = delete;
  PyManager& operator=(const PyManager&) = delete;
  train::CheckpointManager& get() { return *manager_; }

 private:
  py::object checkpoint_;
  std::unique_ptr<train::CheckpointManager> manager_;
};

}  // namespace

void bind_train(py::module_& module) {
  py::module_ t = module.def_submodule("train", "tf.train's checkpoints");
  py::class_<train::RestoreStatus>(t, "_RestoreStatus")
      .def_property_readonly("path", &train::RestoreStatus::path)
      .def_property_readonly("unused", &train::RestoreStatus::unused)
      .def("assert_consumed", [](const train::RestoreStatus& s) { s.assert_consumed(); });
  py::class_<PyCheckpoint>(t, "_Checkpoint")
      .def(py::init<const py::list&>())
      .def("save", [](PyCheckpoint& c, const std::string& prefix) { return c.get().save(prefix); },
           py::call_guard<py::gil_scoped_release>())
      .def("write", [](PyCheckpoint& c, const std::string& path) { return c.get().write(path); },
           py::call_guard<py::gil_scoped_release>())
      .def("restore", [](PyCheckpoint& c, const std::string& path, bool partial) {
        return c.get().restore(path, train::RestoreOptions{partial});
      }, py::arg("path"), py::arg("partial") = false, py::call_guard<py::gil_scoped_release>())
      .def_property("save_counter", [](PyCheckpoint& c) { return c.get().save_counter(); },
                    [](PyCheckpoint& c, std::int64_t n) { c.get().set_save_counter(n); });
  py::class_<PyManager>(t, "_CheckpointManager")
      .def(py::init<py::object, const std::string&, int, double, const std::string&>())
      .def("save", [](PyManager& m, std::optional<std::int64_t> number) { return m.get().save(number); },
           py::arg("checkpoint_number") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("sync", [](PyManager& m) { m.get().sync(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("latest_checkpoint", [](const PyManager& m) {
        return const_cast<PyManager&>(m).get().latest_checkpoint();
      })
      .def_property_readonly("checkpoints", [](const PyManager& m) { return const_cast<PyManager&>(m).get().checkpoints(); })
      .def_property_readonly("directory", [](const PyManager& m) { return const_cast<PyManager&>(m).get().directory(); })
      .def("restore_latest", [](PyManager& m) {
        train::RestoredCheckpoint r;
        {
          py::gil_scoped_release release;
          r = m.get().restore_latest();
        }
        py::list skipped;
        for (const auto& s : r.skipped) skipped.append(py::make_tuple(s.path, s.reason));
        return py::make_tuple(r.path, r.number, skipped);
      });
}

}  // namespace dtrain::python
