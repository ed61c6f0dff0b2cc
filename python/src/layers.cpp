// Layers and models written in Python (subclasses of tf.keras.layers.Layer and
// tf.keras.Model): a dtrain layer whose build and call run the Python methods under the
// GIL, whose weights are dtrain variables (add_weight), and which tracks the layers its
// Python code calls, so that fit, evaluate, checkpoints and every strategy see their
// weights. Layers written in C++ inside it run without the GIL, as everywhere.
#include <pybind11/stl.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "dtrain/model/serialization.h"
#include "dtrain/nn/initializers.h"

namespace dtrain::python {
namespace {

// A Python exception as the dtrain error that carries it through C++ (fit's threads), the
// Python type and message in its text.
[[noreturn]] void rethrow_python(py::error_already_set& e, const std::string& who) {
  const std::string type = py::str(e.type().attr("__name__")).cast<std::string>();
  const std::string message = py::str(e.value()).cast<std::string>();
  DTRAIN_THROW(InvalidArgument, who, ": ", type, ": ", message);
}

class PyLayer final : public nn::Layer {
 public:
  PyLayer(py::handle owner, std::string name, std::string class_name)
      : Layer(std::move(name)), owner_(hold(py::weakref(owner))), class_name_(std::move(class_name)) {}

  std::string class_name() const override { return class_name_; }

  // The Python call on one row of zeros gives the output's shape (Keras traces it
  // symbolically; a call of one row is the same for the layers dtrain has).
  Shape compute_output_shape(const Shape& input_shape) const override {
    if (input_shape.rank() < 1) fail("expects inputs with a batch axis, got " + input_shape.to_string());
    std::vector<std::int64_t> row(input_shape.dims().begin() + 1, input_shape.dims().end());
    {
      const std::lock_guard lock(mutex_);
      if (const auto it = output_rows_.find(row); it != output_rows_.end()) return with_rows(input_shape[0], it->second);
    }
    // Building adds weights: the layer is never const while its shape is asked first.
    auto& self = const_cast<PyLayer&>(*this);
    self.build_python(input_shape);
    std::vector<std::int64_t> one{1};
    one.insert(one.end(), row.begin(), row.end());
    const Tensor y = self.run(Tensor::zeros(Shape(one)), false);
    if (y.rank() < 1) fail("call() returned a scalar; a layer's output keeps the batch axis");
    std::vector<std::int64_t> out(y.shape().dims().begin() + 1, y.shape().dims().end());
    const std::lock_guard lock(mutex_);
    output_rows_[row] = out;
    return with_rows(input_shape[0], out);
  }

  void track(std::shared_ptr<nn::Layer> sublayer) { track_sublayer(std::move(sublayer)); }

  Variable& weight(const std::string& name, Tensor initial, bool trainable, std::optional<nn::Regularizer> regularizer,
                   std::optional<Constraint> constraint) {
    return add_weight(name, std::move(initial), trainable, regularizer, constraint);
  }

  // Random streams of the sublayers that draw (Dropout's), each as [count, values...].
  std::vector<std::uint64_t> rng_state() const override {
    std::vector<std::uint64_t> out;
    for (const auto& l : sublayers()) {
      const std::vector<std::uint64_t> s = l->rng_state();
      out.push_back(s.size());
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }
  void set_rng_state(std::span<const std::uint64_t> state) override {
    std::size_t at = 0;
    for (const auto& l : sublayers()) {
      if (at >= state.size() || state.size() - at - 1 < state[at])
        fail("the saved random streams do not fit its sublayers");
      const std::size_t n = state[at];
      if (n > 0) l->set_rng_state(state.subspan(at + 1, n));
      at += 1 + n;
    }
    if (at != state.size()) fail("the saved random streams do not fit its sublayers");
  }

 protected:
  void build_weights(const Shape& input_shape) override { build_python(input_shape); }
  Tensor call(const Tensor& x, bool training) override { return run(x, training); }

 private:
  std::shared_ptr<py::object> owner_;  // a weak reference: the Python layer owns this one
  std::string class_name_;
  bool python_built_ = false;
  mutable std::mutex mutex_;
  mutable std::map<std::vector<std::int64_t>, std::vector<std::int64_t>> output_rows_;

  static Shape with_rows(std::int64_t rows, const std::vector<std::int64_t>& row) {
    std::vector<std::int64_t> dims{rows};
    dims.insert(dims.end(), row.begin(), row.end());
    return Shape(dims);
  }

  py::object owner() const {
    py::object o = (*owner_)();
    if (o.is_none()) fail("its Python object is gone");
    return o;
  }

  // Python's build(input_shape), once; then the layers it made are tracked.
  void build_python(const Shape& input_shape) {
    if (python_built_) return;
    py::gil_scoped_acquire gil;
    try {
      py::list dims;
      dims.append(py::none());
      for (int i = 1; i < input_shape.rank(); ++i) dims.append(input_shape[i]);
      owner().attr("_dtrain_build")(py::tuple(dims));
    } catch (py::error_already_set& e) {
      rethrow_python(e, "layer '" + name() + "' (" + class_name_ + ") build");
    }
    python_built_ = true;
  }

  Tensor run(const Tensor& x, bool training) {
    py::gil_scoped_acquire gil;
    py::object y;
    try {
      y = owner().attr("_dtrain_call")(x, training);
    } catch (py::error_already_set& e) {
      rethrow_python(e, "layer '" + name() + "' (" + class_name_ + ") call");
    }
    if (!py::isinstance<Tensor>(y))
      fail("call() returned a " + py::str(py::type::handle_of(y).attr("__name__")).cast<std::string>() +
           "; a layer returns one tensor");
    return y.cast<Tensor>();
  }
};

}  // namespace

void bind_own_layers(py::module_& k) {
  py::class_<PyLayer, nn::Layer, std::shared_ptr<PyLayer>>(k, "_PyLayer")
      .def(py::init<py::handle, std::string, std::string>(), py::arg("owner"), py::arg("name"), py::arg("class_name"))
      .def("_track", [](PyLayer& layer, std::shared_ptr<nn::Layer> sublayer) { layer.track(std::move(sublayer)); })
      .def("_add_weight",
           [](PyLayer& layer, const std::string& name, std::vector<std::int64_t> shape, py::object initializer,
              std::optional<std::uint64_t> seed, bool trainable, const std::string& regularizer,
              const std::string& constraint) -> Variable& {
             Tensor initial;
             if (py::isinstance<py::str>(initializer)) {
               Generator g(seed ? *seed : next_seed());
               initial = nn::initialize(initializer.cast<std::string>(), Shape(shape), g);
             } else {
               initial = to_tensor(initializer, name.c_str(), "float32").clone();
               if (!(initial.shape() == Shape(shape)))
                 throw py::value_error("add_weight '" + name + "': the initializer gave " + initial.shape().to_string() +
                                       " for shape " + Shape(shape).to_string());
             }
             const std::string where = "layer '" + layer.name() + "' add_weight '" + name + "'";
             const nlohmann::json config = {{"regularizer", nlohmann::json::parse(regularizer)},
                                            {"constraint", nlohmann::json::parse(constraint)}};
             return layer.weight(name, initial, trainable, regularizer_from_json(config, "regularizer", where),
                                 constraint_from_json(config, "constraint", where));
           },
           py::arg("name"), py::arg("shape"), py::arg("initializer"), py::arg("seed"), py::arg("trainable"),
           py::arg("regularizer"), py::arg("constraint"), py::return_value_policy::reference_internal)
      .def("_set_activity_regularizer", [](PyLayer& layer, const std::string& regularizer) {
        const nlohmann::json config = {{"regularizer", nlohmann::json::parse(regularizer)}};
        layer.set_activity_regularizer(
            regularizer_from_json(config, "regularizer", "layer '" + layer.name() + "' activity_regularizer"));
      });
  // A built-in layer made outside a model, from its Keras entry {"class_name", "config"}.
  // MultiHeadAttention called on tensors with Keras's keywords (a functional graph keeps
  // use_causal_mask with the layer instead).
  // With return_scores, (the output, the attention scores) as Keras's return_attention_scores.
  k.def("_attend", [](const std::shared_ptr<nn::Layer>& layer, py::handle query, py::handle value, py::handle key,
                      py::handle mask, bool causal, bool training, bool return_scores) -> py::object {
    auto* mha = dynamic_cast<nn::MultiHeadAttention*>(layer.get());
    if (!mha) throw py::type_error("layer '" + layer->name() + "' is not a MultiHeadAttention");
    const Tensor q = to_tensor(query, "MultiHeadAttention query"), v = to_tensor(value, "MultiHeadAttention value");
    const Tensor kt = key.is_none() ? Tensor() : to_tensor(key, "MultiHeadAttention key");
    const Tensor m = mask.is_none() ? Tensor() : to_tensor(mask, "MultiHeadAttention attention_mask");
    Tensor out, scores;
    {
      py::gil_scoped_release release;
      out = mha->attend(q, v, kt, m, causal, training);
      if (return_scores) scores = mha->attention_scores(q, v, kt, m, causal);
    }
    if (!return_scores) return py::cast(out);
    return py::make_tuple(out, scores);
  });
  k.def("_layer_from_config", [](const std::string& entry) {
    return layer_from_json(nlohmann::json::parse(entry), "layer");
  });
  // A Sequential of dtrain layers (built-in or Python's).
  k.def("_sequential", [](const std::string& name, std::vector<std::shared_ptr<nn::Layer>> layers) {
    return std::shared_ptr<Model>(std::make_shared<Sequential>(std::move(layers), name));
  });
}

}  // namespace dtrain::python
