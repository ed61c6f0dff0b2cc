// Keras: layers and models (made from Keras's JSON, as the dtrain command makes them),
// compile / fit / evaluate / predict, optimizers and schedules, losses, metrics and
// callbacks, Python subclasses of Callback included. fit runs without the GIL; Python
// callbacks take it for their calls, and Ctrl-C ends fit after the batch under way.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "dtrain/model/compile_config.h"
#include "dtrain/model/serialization.h"
#include "dtrain/nn/policy.h"

namespace dtrain::python {
namespace {

py::dict logs_dict(const Logs& logs) {
  py::dict d;
  for (const auto& [name, value] : logs.items()) d[py::str(name)] = value;
  return d;
}

// A Callback whose methods a Python subclass may override (Keras's signatures:
// on_epoch_end(self, epoch, logs=None), ...).
class PyCallback : public Callback {
 public:
  void on_train_begin(const Logs& logs) override { call("on_train_begin", logs); }
  void on_train_end(const Logs& logs) override { call("on_train_end", logs); }
  void on_epoch_begin(int epoch, const Logs& logs) override { call("on_epoch_begin", logs, epoch); }
  void on_epoch_end(int epoch, const Logs& logs) override { call("on_epoch_end", logs, epoch); }
  void on_train_batch_begin(std::int64_t batch, const Logs& logs) override {
    call("on_train_batch_begin", logs, batch);
  }
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override { call("on_train_batch_end", logs, batch); }

 private:
  template <typename... Index>
  void call(const char* name, const Logs& logs, Index... index) {
    py::gil_scoped_acquire gil;
    py::function override = py::get_override(static_cast<const Callback*>(this), name);
    if (override) override(index..., logs_dict(logs));
  }
};

// Added to every fit from Python: Python's signal handlers run between batches (fit holds
// no GIL), and a KeyboardInterrupt ends fit after the batch under way, raised once fit is out.
class InterruptCheck : public Callback {
 public:
  void on_train_batch_end(std::int64_t, const Logs&) override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      error_ = std::make_unique<py::error_already_set>();
      if (model_) model_->stop_training = true;
    }
  }
  // Raises what a signal handler raised (KeyboardInterrupt), with the GIL held.
  void raise_if_interrupted() {
    if (!error_) return;
    std::unique_ptr<py::error_already_set> e = std::move(error_);
    throw *e;
  }

 private:
  std::unique_ptr<py::error_already_set> error_;
};

std::vector<std::shared_ptr<Callback>> callbacks_of(py::handle callbacks) {
  std::vector<std::shared_ptr<Callback>> out;
  if (callbacks.is_none()) return out;
  for (py::handle c : callbacks) {
    if (!py::isinstance<Callback>(c))
      throw py::type_error("fit: callbacks must be tf.keras.callbacks.Callback objects, got " +
                           py::str(py::type::handle_of(c).attr("__name__")).cast<std::string>());
    out.push_back(c.cast<std::shared_ptr<Callback>>());
  }
  return out;
}

py::dict history_dict(const History& h) {
  py::dict d;
  for (const auto& [name, values] : h.history) d[py::str(name)] = py::cast(values);
  return d;
}

int verbose_of(py::handle verbose) {
  if (py::isinstance<py::str>(verbose)) {
    const std::string v = verbose.cast<std::string>();
    if (v == "auto") return -1;
    throw py::value_error("verbose: 'auto', 0, 1 or 2, got '" + v + "'");
  }
  return verbose.cast<int>();
}

// Python's own buffered output first, so that fit's lines (written by C++) come after it.
void flush_python_stdout() { py::module_::import("sys").attr("stdout").attr("flush")(); }

// The model's inputs or targets from Python: a list of arrays or tensors, one for each.
std::vector<Tensor> tensors_of(const py::handle& list, const char* what) {
  std::vector<Tensor> out;
  for (py::handle t : list) out.push_back(to_tensor(t, what));
  return out;
}

TensorData data_of(const py::handle& x, const py::handle& y, const std::string& who) {
  return TensorData(tensors_of(x, (who + " x").c_str()), tensors_of(y, (who + " y").c_str()));
}

// fit on lists of numpy arrays or tensors (x: one per input, y: one per output) or on a
// Dataset (x, y None), without the GIL; what a Ctrl-C during it raised is raised once it is out.
std::shared_ptr<History> run_fit(Model& model, const py::object& x, const py::object& y,
                                 const py::object& validation_data, FitOptions options) {
  auto interrupt = std::make_shared<InterruptCheck>();
  options.callbacks.push_back(interrupt);
  if (!validation_data.is_none()) {
    if (py::isinstance<data::Dataset>(validation_data)) {
      options.validation_dataset = validation_data.cast<data::Dataset>();
    } else {
      py::tuple v = validation_data.cast<py::tuple>();
      if (v.size() < 2) throw py::value_error("fit: validation_data is (x_val, y_val)");
      options.validation_data = data_of(v[0], v[1], "validation_data");
    }
  }
  flush_python_stdout();
  History result;
  if (py::isinstance<data::Dataset>(x)) {
    if (!y.is_none()) throw py::value_error("fit: y is given inside the dataset; pass y=None with a Dataset");
    const data::Dataset dataset = x.cast<data::Dataset>();
    py::gil_scoped_release release;
    result = model.fit(dataset, options);
  } else {
    if (y.is_none()) throw py::value_error("fit: y (the targets) is missing; give y, or a Dataset of (x, y)");
    const TensorData d = data_of(x, y, "fit");
    py::gil_scoped_release release;
    result = model.fit(d, options);
  }
  interrupt->raise_if_interrupted();
  return std::make_shared<History>(std::move(result));
}

std::shared_ptr<Model> model_from(const std::string& json, const std::string& dtype_policy) {
  const nlohmann::json value = nlohmann::json::parse(json, nullptr, false);
  if (value.is_discarded()) throw py::value_error("model config: not valid JSON");
  return std::shared_ptr<Model>(dtrain::model_from_json(value, "model", dtype_policy).release());
}

std::shared_ptr<optim::LearningRateSchedule> schedule_of(py::handle lr) {
  if (py::isinstance<optim::LearningRateSchedule>(lr)) return lr.cast<std::shared_ptr<optim::LearningRateSchedule>>();
  if (!py::isinstance<py::float_>(lr) && !py::isinstance<py::int_>(lr))
    throw py::type_error("learning_rate: a number or a tf.keras.optimizers.schedules schedule, got " +
                         py::repr(lr).cast<std::string>());
  return std::make_shared<optim::Constant>(lr.cast<float>());
}

// Keras's save_freq: "epoch" or a number of batches.
train::SaveFreq save_freq_of(py::handle value, const char* what) {
  if (py::isinstance<py::int_>(value)) return value.cast<std::int64_t>();
  if (py::isinstance<py::str>(value) && value.cast<std::string>() == "epoch") return "epoch";
  throw py::value_error(std::string(what) + ": save_freq is 'epoch' or a number of batches, got " +
                        py::repr(value).cast<std::string>());
}

optim::OptimizerOptions optimizer_options(py::object clipnorm, py::object global_clipnorm, float weight_decay) {
  optim::OptimizerOptions o;
  if (!clipnorm.is_none()) o.clipnorm = clipnorm.cast<float>();
  if (!global_clipnorm.is_none()) o.global_clipnorm = global_clipnorm.cast<float>();
  o.weight_decay = weight_decay;
  return o;
}

// Metrics count every example once: a weight given to update_state is refused by name,
// not dropped.
void refuse_sample_weight(const metrics::Metric& metric, py::handle sample_weight) {
  if (sample_weight.is_none()) return;
  PyErr_SetString(PyExc_NotImplementedError, (metric.name() + ".update_state(sample_weight=...) is not supported by "
                                              "dtrain: metrics count every example once").c_str());
  throw py::error_already_set();
}

// How the gradients relate to a loss scale: none (the plain update), scaled (Keras 3's
// LossScaleOptimizer.apply) or unscaled already (TensorFlow 2's get_unscaled_gradients).
enum class Scaling { none, scaled, unscaled };

void apply_gradients(optim::Optimizer& optimizer, py::handle grads_and_vars, Scaling scaling = Scaling::none) {
  std::vector<Tensor> grads;
  std::vector<Variable*> vars;
  for (py::handle pair : grads_and_vars) {
    py::tuple gv = py::reinterpret_borrow<py::object>(pair).cast<py::tuple>();
    if (gv.size() != 2) throw py::value_error("apply_gradients: takes (gradient, variable) pairs");
    if (gv[0].is_none()) continue;  // a variable the loss does not depend on, as TensorFlow skips it
    Variable& v = gv[1].cast<Variable&>();
    grads.push_back(to_tensor(gv[0], v.name().c_str()));
    vars.push_back(&v);
  }
  if (vars.empty()) throw py::value_error("apply_gradients: no gradient was given for any variable");
  py::gil_scoped_release release;
  switch (scaling) {
    case Scaling::none: optimizer.apply_gradients(grads, vars); break;
    case Scaling::scaled: optimizer.apply_scaled_gradients(grads, vars); break;
    case Scaling::unscaled: optimizer.apply_unscaled_gradients(grads, vars); break;
  }
}

losses::Reduction reduction_of(const std::string& name) { return losses::reduction_from_name(name); }

}  // namespace

void bind_keras(py::module_& m) {
  py::module_ k = m.def_submodule("keras", "Keras's models, layers, optimizers, losses, metrics and callbacks");

  // keras.mixed_precision's global policy: what layers made from now on compute in.
  k.def("_set_global_policy", [](const std::string& name) { nn::set_global_policy(name); });
  k.def("_global_policy", [] { return nn::global_policy().name; });
  // tf.summary's file writer: TensorBoard's event files (model/tensorboard.h).
  py::class_<tensorboard::EventWriter>(k, "_EventWriter")
      .def(py::init<const std::string&>())
      .def_property_readonly("path", &tensorboard::EventWriter::path)
      .def("scalar", &tensorboard::EventWriter::scalar)
      .def("histogram", [](tensorboard::EventWriter& w, const std::string& tag, py::handle values, std::int64_t step,
                           int buckets) {
        const Tensor t = to_tensor(values, "tf.summary.histogram", "float32");
        const std::vector<float> v = t.to_vector();
        w.histogram(tag, v, step, buckets);
      }, py::arg("tag"), py::arg("values"), py::arg("step"), py::arg("buckets") = 30)
      .def("text", &tensorboard::EventWriter::text);

  py::class_<nn::Layer, std::shared_ptr<nn::Layer>> layer_class(k, "Layer");
  py::class_<nn::Normalization, nn::Layer, std::shared_ptr<nn::Normalization>>(k, "_Normalization")
      .def("set_statistics", &nn::Normalization::set_statistics);
  layer_class
      .def_property_readonly("name", &nn::Layer::name)
      .def_property_readonly("class_name", &nn::Layer::class_name)
      .def_property_readonly("built", &nn::Layer::built)
      .def_property("trainable", &nn::Layer::trainable, &nn::Layer::set_trainable)
      .def_property_readonly("variables", &nn::Layer::variables, py::return_value_policy::reference_internal)
      .def_property_readonly("weights", &nn::Layer::variables, py::return_value_policy::reference_internal)
      .def_property_readonly("losses", &nn::Layer::losses)
      .def_property_readonly("trainable_variables", &nn::Layer::trainable_variables,
                             py::return_value_policy::reference_internal)
      .def("__call__", [](nn::Layer& layer, py::handle x, bool training) {
        const Tensor t = to_tensor(x, layer.name().c_str());
        py::gil_scoped_release release;
        return layer(t, training);
      }, py::arg("inputs"), py::arg("training") = false);

  bind_own_layers(k);

  py::class_<Model, std::shared_ptr<Model>>(k, "_Model")
      .def_static("from_json", &model_from, py::arg("json"), py::arg("dtype_policy") = "")
      .def("build", [](Model& model, std::vector<std::int64_t> row) { model.build(Shape(row)); })
      .def_property_readonly("built", &Model::built)
      .def_property_readonly("name", &Model::name)
      .def("__call__", [](Model& model, py::handle x, bool training) {
        const Tensor t = to_tensor(x, "model input");
        py::gil_scoped_release release;
        return model(t, training);
      }, py::arg("inputs"), py::arg("training") = false)
      // A model of several inputs or outputs: a list of inputs in, a list of outputs out.
      .def("call_all", [](Model& model, py::handle xs, bool training) {
        const std::vector<Tensor> ts = tensors_of(xs, "model input");
        py::gil_scoped_release release;
        return model(ts, training);
      }, py::arg("inputs"), py::arg("training") = false)
      .def_property_readonly("num_inputs", &Model::num_inputs)
      .def_property_readonly("num_outputs", &Model::num_outputs)
      .def_property_readonly("input_names", [](const Model& model) {
        std::vector<std::string> names;
        for (const KerasTensor& t : model.inputs()) names.push_back(t.name());
        return names;
      })
      .def_property_readonly("output_names", &Model::output_names)
      .def("compile", [](Model& model, std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<losses::Loss> loss,
                         std::vector<std::string> metrics) { model.compile(std::move(optimizer), std::move(loss), metrics); })
      .def("compile_outputs", [](Model& model, std::shared_ptr<optim::Optimizer> optimizer,
                                 std::vector<std::shared_ptr<losses::Loss>> losses,
                                 std::vector<std::vector<std::string>> metrics, std::vector<double> loss_weights) {
        model.compile(std::move(optimizer), std::move(losses), metrics, std::move(loss_weights));
      })
      .def("compile_names", [](Model& model, const std::string& optimizer, const std::string& loss,
                               std::vector<std::string> metrics, bool from_logits) {
        model.compile(optimizer, loss, metrics, from_logits);
      })
      .def_property_readonly("compiled", &Model::compiled)
      .def("fit", [](Model& model, py::object x, py::object y, std::int64_t batch_size, int epochs, py::object verbose,
                     py::object callbacks, double validation_split, py::object validation_data, bool shuffle,
                     std::uint64_t seed, int initial_epoch, std::int64_t steps_per_epoch, int accumulation,
                     int steps_per_execution) {
        return run_fit(model, x, y, validation_data,
                       FitOptions{.epochs = epochs,
                                  .batch_size = batch_size,
                                  .steps_per_epoch = steps_per_epoch,
                                  .validation_split = validation_split,
                                  .shuffle = shuffle,
                                  .seed = seed,
                                  .gradient_accumulation_steps = accumulation,
                                  .initial_epoch = initial_epoch,
                                  .steps_per_execution = steps_per_execution,
                                  .callbacks = callbacks_of(callbacks),
                                  .verbose = verbose_of(verbose)});
      })
      .def("evaluate", [](Model& model, py::object x, py::object y, std::int64_t batch_size, int verbose) {
        EvaluateOptions options{.batch_size = batch_size, .verbose = verbose};
        Logs logs;
        flush_python_stdout();
        if (py::isinstance<data::Dataset>(x)) {
          const data::Dataset dataset = x.cast<data::Dataset>();
          py::gil_scoped_release release;
          logs = model.evaluate(dataset, options);
        } else {
          const TensorData d = data_of(x, y, "evaluate");
          py::gil_scoped_release release;
          logs = model.evaluate(d, options);
        }
        return logs_dict(logs);
      })
      .def("predict", [](Model& model, py::handle x, std::int64_t batch_size) {
        const Tensor t = to_tensor(x, "predict x");
        Tensor out;
        {
          py::gil_scoped_release release;
          out = model.predict(t, batch_size);
        }
        return to_numpy(out);
      })
      .def("predict_all", [](Model& model, py::handle xs, std::int64_t batch_size) {
        const std::vector<Tensor> ts = tensors_of(xs, "predict x");
        std::vector<Tensor> out;
        {
          py::gil_scoped_release release;
          out = model.predict(ts, batch_size);
        }
        py::list arrays;
        for (const Tensor& t : out) arrays.append(to_numpy(t));
        return arrays;
      })
      .def("summary", &Model::summary)
      .def("to_json", &Model::to_json, py::arg("indent") = 2)
      .def("save_weights", &Model::save_weights, py::call_guard<py::gil_scoped_release>())
      .def("load_weights", &Model::load_weights, py::call_guard<py::gil_scoped_release>())
      .def("save", &Model::save, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("layers", &Model::layers)
      .def_property_readonly("variables", &Model::variables, py::return_value_policy::reference_internal)
      .def_property_readonly("trainable_variables", &Model::trainable_variables,
                             py::return_value_policy::reference_internal)
      .def("count_params", &Model::count_params)
      .def_property_readonly("losses", &Model::losses)
      .def_readwrite("stop_training", &Model::stop_training)
      .def_property_readonly("input_shape", [](const Model& model) -> py::object {
        if (!model.input_shape()) return py::none();
        return py::tuple(py::cast(model.input_shape()->to_vector()));
      })
      .def_property_readonly("output_shape", [](const Model& model) { return py::tuple(py::cast(model.output_shape().to_vector())); });
  k.def("_load_fashion_mnist", [](const std::string& dir) {
    data::Classification d;
    {
      py::gil_scoped_release release;
      d = data::load_fashion_mnist(dir, DType::u8);
    }
    auto images = [](const Tensor& t) { return to_numpy(t.reshape(Shape{t.dim(0), 28, 28})); };
    auto labels = [](const Tensor& t) { return py::array(to_numpy(t).attr("astype")("uint8")); };
    return py::make_tuple(py::make_tuple(images(d.train.x), labels(d.train.y)),
                          py::make_tuple(images(d.test.x), labels(d.test.y)));
  }, py::arg("dir") = "");
  k.def("_load_model", [](const std::string& path, bool compile) {
    return std::shared_ptr<Model>(models::load_model(path, compile).release());
  });

  py::class_<History, std::shared_ptr<History>>(k, "_History")
      .def_property_readonly("history", &history_dict)
      .def_readonly("epoch", &History::epoch)
      .def_readonly("epoch_seconds", &History::epoch_seconds)
      .def_readonly("samples_per_second", &History::samples_per_second)
      .def_readonly("input_wait_seconds", &History::input_wait_seconds)
      .def_property_readonly("non_finite", [](const History& h) -> py::object {
        return h.non_finite ? py::object(py::str(h.non_finite->to_string())) : py::object(py::none());
      });

  // Optimizers and schedules.
  py::module_ o = k.def_submodule("optimizers");
  py::module_ s = o.def_submodule("schedules");
  py::class_<optim::LearningRateSchedule, std::shared_ptr<optim::LearningRateSchedule>>(s, "LearningRateSchedule")
      .def("__call__", [](const optim::LearningRateSchedule& l, std::int64_t step) { return l(step); });
  py::class_<optim::ExponentialDecay, optim::LearningRateSchedule, std::shared_ptr<optim::ExponentialDecay>>(s, "ExponentialDecay")
      .def(py::init<float, std::int64_t, float, bool>(), py::arg("initial_learning_rate"), py::arg("decay_steps"),
           py::arg("decay_rate"), py::arg("staircase") = false);
  py::class_<optim::PiecewiseConstantDecay, optim::LearningRateSchedule, std::shared_ptr<optim::PiecewiseConstantDecay>>(
      s, "PiecewiseConstantDecay")
      .def(py::init<std::vector<std::int64_t>, std::vector<float>>(), py::arg("boundaries"), py::arg("values"));
  py::class_<optim::CosineDecay, optim::LearningRateSchedule, std::shared_ptr<optim::CosineDecay>>(s, "CosineDecay")
      .def(py::init<float, std::int64_t, float>(), py::arg("initial_learning_rate"), py::arg("decay_steps"),
           py::arg("alpha") = 0.0f);

  py::class_<optim::Optimizer, std::shared_ptr<optim::Optimizer>>(o, "Optimizer")
      .def_property_readonly("name", &optim::Optimizer::name)
      .def_property("iterations", &optim::Optimizer::iterations, &optim::Optimizer::set_iterations)
      .def_property("learning_rate", &optim::Optimizer::learning_rate, [](optim::Optimizer& opt, py::handle lr) {
        opt.set_learning_rate(schedule_of(lr));
      })
      .def("apply_gradients", [](optim::Optimizer& opt, py::handle pairs) { apply_gradients(opt, pairs); },
           py::arg("grads_and_vars"))
      // keras.mixed_precision.LossScaleOptimizer's state, kept by the optimizer it wraps.
      .def("_set_loss_scale", [](optim::Optimizer& opt, bool dynamic, float initial_scale, std::int64_t growth_steps) {
        opt.set_loss_scale(optim::LossScale{dynamic, initial_scale, growth_steps});
      })
      .def_property_readonly("_has_loss_scale", [](const optim::Optimizer& opt) { return opt.loss_scale_options().has_value(); })
      .def_property_readonly("_loss_scale", &optim::Optimizer::loss_scale)
      .def_property_readonly("_loss_scale_good_steps", &optim::Optimizer::loss_scale_good_steps)
      .def_property_readonly("_last_update_skipped", &optim::Optimizer::last_update_skipped)
      .def("_apply_scaled_gradients", [](optim::Optimizer& opt, py::handle pairs) { apply_gradients(opt, pairs, Scaling::scaled); })
      .def("_apply_unscaled_gradients", [](optim::Optimizer& opt, py::handle pairs) {
        apply_gradients(opt, pairs, Scaling::unscaled);
      });
  py::class_<optim::SGD, optim::Optimizer, std::shared_ptr<optim::SGD>>(o, "SGD")
      .def(py::init([](py::handle lr, float momentum, bool nesterov, py::object clipnorm, py::object global_clipnorm,
                       float weight_decay) {
             return std::make_shared<optim::SGD>(schedule_of(lr), momentum, nesterov,
                                                 optimizer_options(clipnorm, global_clipnorm, weight_decay));
           }),
           py::arg("learning_rate") = 0.01f, py::arg("momentum") = 0.0f, py::arg("nesterov") = false,
           py::arg("clipnorm") = py::none(), py::arg("global_clipnorm") = py::none(), py::arg("weight_decay") = 0.0f);
  py::class_<optim::Adam, optim::Optimizer, std::shared_ptr<optim::Adam>>(o, "Adam")
      .def(py::init([](py::handle lr, float beta_1, float beta_2, float epsilon, py::object clipnorm,
                       py::object global_clipnorm, float weight_decay) {
             return std::make_shared<optim::Adam>(schedule_of(lr), optim::AdamOptions{beta_1, beta_2, epsilon},
                                                  optimizer_options(clipnorm, global_clipnorm, weight_decay));
           }),
           py::arg("learning_rate") = 0.001f, py::arg("beta_1") = 0.9f, py::arg("beta_2") = 0.999f,
           py::arg("epsilon") = 1e-7f, py::arg("clipnorm") = py::none(), py::arg("global_clipnorm") = py::none(),
           py::arg("weight_decay") = 0.0f);
  py::class_<optim::AdamW, optim::Adam, std::shared_ptr<optim::AdamW>>(o, "AdamW")
      .def(py::init([](py::handle lr, float weight_decay, float beta_1, float beta_2, float epsilon, py::object clipnorm,
                       py::object global_clipnorm) {
             return std::make_shared<optim::AdamW>(schedule_of(lr), weight_decay, optim::AdamOptions{beta_1, beta_2, epsilon},
                                                   optimizer_options(clipnorm, global_clipnorm, 0.0f));
           }),
           py::arg("learning_rate") = 0.001f, py::arg("weight_decay") = 0.004f, py::arg("beta_1") = 0.9f,
           py::arg("beta_2") = 0.999f, py::arg("epsilon") = 1e-7f, py::arg("clipnorm") = py::none(),
           py::arg("global_clipnorm") = py::none());
  py::class_<optim::RMSprop, optim::Optimizer, std::shared_ptr<optim::RMSprop>>(o, "RMSprop")
      .def(py::init([](py::handle lr, float rho, float momentum, float epsilon, bool centered, py::object clipnorm,
                       py::object global_clipnorm, float weight_decay) {
             return std::make_shared<optim::RMSprop>(schedule_of(lr), optim::RMSpropOptions{rho, momentum, epsilon, centered},
                                                     optimizer_options(clipnorm, global_clipnorm, weight_decay));
           }),
           py::arg("learning_rate") = 0.001f, py::arg("rho") = 0.9f, py::arg("momentum") = 0.0f,
           py::arg("epsilon") = 1e-7f, py::arg("centered") = false, py::arg("clipnorm") = py::none(),
           py::arg("global_clipnorm") = py::none(), py::arg("weight_decay") = 0.0f);
  py::class_<optim::Adagrad, optim::Optimizer, std::shared_ptr<optim::Adagrad>>(o, "Adagrad")
      .def(py::init([](py::handle lr, float initial_accumulator_value, float epsilon, py::object clipnorm,
                       py::object global_clipnorm, float weight_decay) {
             return std::make_shared<optim::Adagrad>(schedule_of(lr), initial_accumulator_value, epsilon,
                                                     optimizer_options(clipnorm, global_clipnorm, weight_decay));
           }),
           py::arg("learning_rate") = 0.001f, py::arg("initial_accumulator_value") = 0.1f, py::arg("epsilon") = 1e-7f,
           py::arg("clipnorm") = py::none(), py::arg("global_clipnorm") = py::none(), py::arg("weight_decay") = 0.0f);

  // Losses: classes, called as loss(y_true, y_pred).
  py::module_ l = k.def_submodule("losses");
  py::class_<losses::Loss, std::shared_ptr<losses::Loss>>(l, "Loss")
      .def_property_readonly("name", &losses::Loss::name)
      .def_property_readonly("reduction", [](const losses::Loss& loss) { return std::string(losses::reduction_name(loss.reduction())); })
      .def("__call__", [](const losses::Loss& loss, py::handle y_true, py::handle y_pred, py::handle sample_weight) {
        const Tensor t = to_tensor(y_true, "y_true"), p = to_tensor(y_pred, "y_pred");
        const Tensor w = sample_weight.is_none() ? Tensor() : to_tensor(sample_weight, "sample_weight");
        py::gil_scoped_release release;
        return w.defined() ? loss(t, p, w) : loss(t, p);
      }, py::arg("y_true"), py::arg("y_pred"), py::arg("sample_weight") = py::none())
      .def("call", [](const losses::Loss& loss, py::handle y_true, py::handle y_pred) {
        const Tensor t = to_tensor(y_true, "y_true"), p = to_tensor(y_pred, "y_pred");
        py::gil_scoped_release release;
        return loss.call(t, p);
      }, py::arg("y_true"), py::arg("y_pred"));
  py::class_<losses::SparseCategoricalCrossentropy, losses::Loss, std::shared_ptr<losses::SparseCategoricalCrossentropy>>(
      l, "SparseCategoricalCrossentropy")
      .def(py::init([](bool from_logits, const std::string& reduction, const std::string& name) {
             return std::make_shared<losses::SparseCategoricalCrossentropy>(from_logits, reduction_of(reduction), name);
           }),
           py::arg("from_logits") = false, py::arg("reduction") = "sum_over_batch_size",
           py::arg("name") = "sparse_categorical_crossentropy");
  py::class_<losses::CategoricalCrossentropy, losses::Loss, std::shared_ptr<losses::CategoricalCrossentropy>>(
      l, "CategoricalCrossentropy")
      .def(py::init([](bool from_logits, float label_smoothing, const std::string& reduction, const std::string& name) {
             return std::make_shared<losses::CategoricalCrossentropy>(from_logits, label_smoothing, reduction_of(reduction), name);
           }),
           py::arg("from_logits") = false, py::arg("label_smoothing") = 0.0f, py::arg("reduction") = "sum_over_batch_size",
           py::arg("name") = "categorical_crossentropy");
  py::class_<losses::MeanSquaredError, losses::Loss, std::shared_ptr<losses::MeanSquaredError>>(l, "MeanSquaredError")
      .def(py::init([](const std::string& reduction, const std::string& name) {
             return std::make_shared<losses::MeanSquaredError>(reduction_of(reduction), name);
           }),
           py::arg("reduction") = "sum_over_batch_size", py::arg("name") = "mean_squared_error");

  // Optimizers and losses as the JSON compile_config.h reads: how pickle sends them to
  // another process (tf.distribute.Server's workers).
  o.def("_to_json", [](const optim::Optimizer& opt) { return optimizer_to_json(opt).dump(); });
  o.def("_from_json", [](const std::string& text) { return optimizer_from_json(nlohmann::json::parse(text), "optimizer"); });
  l.def("_to_json", [](const losses::Loss& loss) { return loss_to_json(loss).dump(); });
  l.def("_from_json", [](const std::string& text) { return loss_from_json(nlohmann::json::parse(text), "loss"); });

  // Metrics, for custom loops (compile takes their names).
  py::module_ mt = k.def_submodule("metrics");
  py::class_<metrics::Metric, std::shared_ptr<metrics::Metric>>(mt, "Metric")
      .def_property_readonly("name", &metrics::Metric::name)
      .def("update_state", [](metrics::Metric& metric, py::handle y_true, py::handle y_pred, py::handle sample_weight) {
        refuse_sample_weight(metric, sample_weight);
        const Tensor t = to_tensor(y_true, "y_true");
        const Tensor p = y_pred.is_none() ? Tensor() : to_tensor(y_pred, "y_pred");
        py::gil_scoped_release release;
        metric.update_state(t, p);
      }, py::arg("y_true"), py::arg("y_pred") = py::none(), py::arg("sample_weight") = py::none())
      .def("result", &metrics::Metric::result)
      // Keras's metric(y_true, y_pred): update_state, then the result.
      .def("__call__", [](py::object self, py::args args, py::kwargs kwargs) {
        self.attr("update_state")(*args, **kwargs);
        return self.attr("result")();
      })
      .def("reset_state", &metrics::Metric::reset_state)
      .def("reset_states", &metrics::Metric::reset_state);
  py::class_<metrics::SparseCategoricalAccuracy, metrics::Metric, std::shared_ptr<metrics::SparseCategoricalAccuracy>>(
      mt, "SparseCategoricalAccuracy")
      .def(py::init<std::string>(), py::arg("name") = "sparse_categorical_accuracy");
  py::class_<metrics::CategoricalAccuracy, metrics::Metric, std::shared_ptr<metrics::CategoricalAccuracy>>(
      mt, "CategoricalAccuracy")
      .def(py::init<std::string>(), py::arg("name") = "categorical_accuracy");
  // Keras's Mean.update_state(values, sample_weight): a second value is a weight, refused.
  py::class_<metrics::Mean, metrics::Metric, std::shared_ptr<metrics::Mean>>(mt, "Mean")
      .def(py::init<std::string>(), py::arg("name") = "mean")
      .def("update_state", [](metrics::Mean& metric, py::handle values, py::handle sample_weight) {
        refuse_sample_weight(metric, sample_weight);
        const Tensor v = to_tensor(values, "values");
        py::gil_scoped_release release;
        metric.update_state(v, Tensor());
      }, py::arg("values"), py::arg("sample_weight") = py::none());

  // Callbacks.
  py::module_ c = k.def_submodule("callbacks");
  py::class_<Callback, PyCallback, std::shared_ptr<Callback>>(c, "Callback", py::dynamic_attr())
      .def(py::init<>())
      .def("on_train_begin", [](Callback&, py::object) {}, py::arg("logs") = py::none())
      .def("on_train_end", [](Callback&, py::object) {}, py::arg("logs") = py::none())
      .def("on_epoch_begin", [](Callback&, int, py::object) {}, py::arg("epoch"), py::arg("logs") = py::none())
      .def("on_epoch_end", [](Callback&, int, py::object) {}, py::arg("epoch"), py::arg("logs") = py::none())
      .def("on_train_batch_begin", [](Callback&, std::int64_t, py::object) {}, py::arg("batch"), py::arg("logs") = py::none())
      .def("on_train_batch_end", [](Callback&, std::int64_t, py::object) {}, py::arg("batch"), py::arg("logs") = py::none());
  py::class_<EarlyStopping, Callback, std::shared_ptr<EarlyStopping>>(c, "EarlyStopping")
      .def(py::init([](const std::string& monitor, double min_delta, int patience, int /*verbose*/, const std::string& mode,
                       std::optional<double> baseline, bool restore_best_weights, int start_from_epoch) {
             return std::make_shared<EarlyStopping>(EarlyStoppingOptions{monitor, min_delta, patience, mode, baseline,
                                                                         restore_best_weights, start_from_epoch});
           }),
           py::arg("monitor") = "val_loss", py::arg("min_delta") = 0.0, py::arg("patience") = 0, py::arg("verbose") = 0,
           py::arg("mode") = "auto", py::arg("baseline") = py::none(), py::arg("restore_best_weights") = false,
           py::arg("start_from_epoch") = 0)
      .def_property_readonly("stopped_epoch", &EarlyStopping::stopped_epoch)
      .def_property_readonly("best_epoch", &EarlyStopping::best_epoch);
  py::class_<ReduceLROnPlateau, Callback, std::shared_ptr<ReduceLROnPlateau>>(c, "ReduceLROnPlateau")
      .def(py::init([](const std::string& monitor, double factor, int patience, int verbose, const std::string& mode,
                       double min_delta, int cooldown, double min_lr, py::kwargs kwargs) {
             for (auto item : kwargs)
               if (item.first.cast<std::string>() != "epsilon")  // Keras 2's name for min_delta
                 throw py::type_error("ReduceLROnPlateau: unexpected argument " + item.first.cast<std::string>());
             if (kwargs.contains("epsilon")) min_delta = kwargs["epsilon"].cast<double>();
             return std::make_shared<ReduceLROnPlateau>(
                 ReduceLROnPlateauOptions{monitor, factor, patience, verbose, mode, min_delta, cooldown, min_lr});
           }),
           py::arg("monitor") = "val_loss", py::arg("factor") = 0.1, py::arg("patience") = 10, py::arg("verbose") = 0,
           py::arg("mode") = "auto", py::arg("min_delta") = 1e-4, py::arg("cooldown") = 0, py::arg("min_lr") = 0.0);
  py::class_<TensorBoard, Callback, std::shared_ptr<TensorBoard>>(c, "_TensorBoard")
      .def(py::init([](const std::string& log_dir, int histogram_freq, std::int64_t update_freq,
                       bool write_steps_per_second, std::int64_t profile_first, std::int64_t profile_last) {
             return std::make_shared<TensorBoard>(TensorBoardOptions{log_dir, histogram_freq, update_freq,
                                                                     write_steps_per_second, profile_first, profile_last});
           }),
           py::arg("log_dir"), py::arg("histogram_freq"), py::arg("update_freq"), py::arg("write_steps_per_second"),
           py::arg("profile_first"), py::arg("profile_last"))
      .def_property_readonly("log_dir", [](const TensorBoard& t) { return t.options().log_dir; });
  py::module_ tb = m.def_submodule("tensorboard", "Event files, for tests and tools");
  tb.def("read_records", [](const std::string& path) {
    py::list out;
    for (const std::string& r : tensorboard::read_records(path)) out.append(py::bytes(r));
    return out;
  });
  py::class_<TerminateOnNaN, Callback, std::shared_ptr<TerminateOnNaN>>(c, "TerminateOnNaN")
      .def(py::init([] { return std::make_shared<TerminateOnNaN>(&std::cout); }));
  py::class_<CSVLogger, Callback, std::shared_ptr<CSVLogger>>(c, "CSVLogger")
      .def(py::init([](const std::string& filename, const std::string& separator, bool append) {
             if (separator.size() != 1) throw py::value_error("CSVLogger: separator is one character");
             return std::make_shared<CSVLogger>(filename, separator[0], append);
           }),
           py::arg("filename"), py::arg("separator") = ",", py::arg("append") = false);
  py::class_<LearningRateScheduler, Callback, std::shared_ptr<LearningRateScheduler>>(c, "LearningRateScheduler")
      .def(py::init([](py::function schedule) {
             // Called on fit's thread, which holds no GIL.
             auto fn = [schedule = hold(std::move(schedule))](int epoch, double lr) {
               py::gil_scoped_acquire gil;
               // schedule(epoch, lr), or schedule(epoch) where that call is a TypeError, as Keras
               // calls it; what it returns must be a number (a float, an int, a tensor of one).
               py::object rate;
               try {
                 rate = (*schedule)(epoch, lr);
               } catch (py::error_already_set& e) {
                 if (!e.matches(PyExc_TypeError)) throw;
                 rate = (*schedule)(epoch);
               }
               PyObject* number =
                   py::isinstance<py::str>(rate) || py::isinstance<py::bytes>(rate) ? nullptr : PyNumber_Float(rate.ptr());
               if (number == nullptr) {
                 PyErr_Clear();
                 throw py::type_error("LearningRateScheduler: the schedule returned " +
                                      py::repr(rate).cast<std::string>() + " for epoch " + std::to_string(epoch) +
                                      "; it must return the learning rate, a number");
               }
               return py::reinterpret_steal<py::float_>(number).cast<double>();
             };
             return std::make_shared<LearningRateScheduler>(fn);
           }),
           py::arg("schedule"));
  py::class_<train::ModelCheckpoint, Callback, std::shared_ptr<train::ModelCheckpoint>>(c, "ModelCheckpoint")
      .def(py::init([](const std::string& filepath, const std::string& monitor, int verbose, bool save_best_only,
                       bool save_weights_only, const std::string& mode, py::object save_freq,
                       std::optional<double> initial_value_threshold) {
             train::ModelCheckpointOptions options;
             options.monitor = monitor;
             options.verbose = verbose;
             options.save_best_only = save_best_only;
             options.save_weights_only = save_weights_only;
             options.mode = mode;
             options.save_freq = save_freq_of(save_freq, "ModelCheckpoint");
             options.initial_value_threshold = initial_value_threshold;
             return std::make_shared<train::ModelCheckpoint>(filepath, options);
           }),
           py::arg("filepath"), py::arg("monitor") = "val_loss", py::arg("verbose") = 0, py::arg("save_best_only") = false,
           py::arg("save_weights_only") = false, py::arg("mode") = "auto", py::arg("save_freq") = "epoch",
           py::arg("initial_value_threshold") = py::none());
  py::class_<train::BackupAndRestore, Callback, std::shared_ptr<train::BackupAndRestore>>(c, "BackupAndRestore")
      .def(py::init([](const std::string& backup_dir, py::object save_freq, bool delete_checkpoint,
                       bool save_before_preemption) {
             train::BackupAndRestoreOptions options;
             options.save_freq = save_freq_of(save_freq, "BackupAndRestore");
             options.delete_checkpoint = delete_checkpoint;
             options.save_before_preemption = save_before_preemption;
             return std::make_shared<train::BackupAndRestore>(backup_dir, options);
           }),
           py::arg("backup_dir"), py::arg("save_freq") = "epoch", py::arg("delete_checkpoint") = true,
           py::arg("save_before_preemption") = true)
      .def_property_readonly("resumed_from", &train::BackupAndRestore::resumed_from);
}

}  // namespace dtrain::python
