// model.save and load_model (saving.h): the whole model in one checksummed file. The
// training loop's own position is BackupAndRestore's business, not this file's.
#include "dtrain/model/saving.h"

#include <charconv>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dtrain/model/compile_config.h"
#include "dtrain/model/json_reader.h"
#include "dtrain/model/safetensors.h"
#include "dtrain/model/serialization.h"

namespace dtrain {
namespace {

using nlohmann::json;

constexpr const char* kModelKey = "dtrain.model";
constexpr const char* kCompileKey = "dtrain.compile";
constexpr const char* kIterationsKey = "dtrain.optimizer_iterations";
// A loss scale's state: "<scale> <good steps>" (the optimizer JSON holds its settings).
constexpr const char* kLossScaleKey = "dtrain.loss_scale";
constexpr const char* kLayerRngKey = "dtrain.layer_rng";

constexpr std::string_view kSlotPrefix = "optimizer/";

std::string slot_key(const Variable& v, const std::string& slot) {
  return std::string(kSlotPrefix) + v.name() + "/" + slot;
}

// What a file without the model's JSON is, for the message.
std::string what_it_is(const NamedTensors& data) {
  if (data.metadata.count("dtrain.state"))
    return "it is a training checkpoint (train::Checkpoint); restore it with Checkpoint::restore into the "
           "objects it was saved from";
  if (data.metadata.count("format") && data.metadata.at("format") == "dtrain")
    return "it holds weights only (Model::save_weights); build the model in code and call load_weights";
  return "it is not a file model.save() wrote";
}

// Runs fn; an InvalidArgument from reading the file's JSON parts becomes an IoError naming
// the file (the bytes are sound, as the checksums said, but their content is not).
template <typename Fn>
auto reading(const std::string& path, Fn&& fn) {
  try {
    return fn();
  } catch (const InvalidArgument& e) {
    throw IoError(path + ": " + e.what());
  }
}

json json_part(const std::string& path, const NamedTensors& data, const char* key) {
  return reading(path, [&] { return parse_json(data.metadata.at(key), std::string("__metadata__.") + key); });
}

const Tensor& tensor_like(const std::string& path, const NamedTensors& data, const std::string& name, const Shape& shape,
                          DType dtype, const std::string& what) {
  const Tensor* t = data.find(name);
  if (!t) DTRAIN_THROW(IoError, path, ": has no tensor '", name, "' (", what, ")");
  if (!(t->shape() == shape) || t->dtype() != dtype)
    DTRAIN_THROW(IoError, path, ": tensor '", name, "' is ", dtype_name(t->dtype()), " ", t->shape().to_string(), ", but ",
                 what, " is ", dtype_name(dtype), " ", shape.to_string());
  return *t;
}

// Recompiles `model` as the file says and puts back the optimizer's iteration count and
// slots. Returns the slot tensors it used.
std::set<std::string> restore_compile(const std::string& path, const NamedTensors& data, Model& model) {
  const json compile = json_part(path, data, kCompileKey);
  std::shared_ptr<optim::Optimizer> optimizer;
  std::vector<std::shared_ptr<losses::Loss>> losses;
  std::vector<std::vector<std::string>> metrics;
  std::vector<double> loss_weights;
  reading(path, [&] {
    const std::string at = std::string("__metadata__.") + kCompileKey;
    const JsonReader r(compile, at);
    r.expect_keys({"optimizer", "loss", "metrics", "loss_weights"});
    optimizer = optimizer_from_json(r.child("optimizer").raw(), r.key_path("optimizer"));
    // A model of several outputs keeps a loss, a metric list and a weight for each.
    const bool several = r.child("loss").raw().is_array();
    if (several) {
      const JsonReader l = r.child("loss");
      for (std::size_t i = 0; i < l.size(); ++i) losses.push_back(loss_from_json(l.raw()[i], l.element(i).path()));
    } else {
      losses.push_back(loss_from_json(r.child("loss").raw(), r.key_path("loss")));
    }
    auto names = [](const JsonReader& m) {
      m.expect_array();
      std::vector<std::string> out;
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (!m.raw()[i].is_string()) m.element(i).fail("", "expected a metric name, got " + m.raw()[i].dump());
        out.push_back(m.raw()[i].get<std::string>());
      }
      return out;
    };
    if (r.has("metrics")) {
      const JsonReader m = r.child("metrics");
      if (several) {
        m.expect_array();
        for (std::size_t i = 0; i < m.size(); ++i) metrics.push_back(names(m.element(i)));
      } else {
        metrics.push_back(names(m));
      }
    }
    if (r.has("loss_weights")) {
      const JsonReader w = r.child("loss_weights");
      w.expect_array();
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (!w.raw()[i].is_number()) w.element(i).fail("", "expected a number, got " + w.raw()[i].dump());
        loss_weights.push_back(w.raw()[i].get<double>());
      }
    }
    model.compile(optimizer, losses, metrics, loss_weights);
    return 0;
  });

  const auto it = data.metadata.find(kIterationsKey);
  if (it == data.metadata.end())
    DTRAIN_THROW(IoError, path, ": has the compile settings but no ", kIterationsKey, " (the optimizer's update count)");
  const std::string& text = it->second;
  std::int64_t iterations = -1;
  const auto parsed = std::from_chars(text.data(), text.data() + text.size(), iterations);
  if (parsed.ec != std::errc() || parsed.ptr != text.data() + text.size() || iterations < 0)
    DTRAIN_THROW(IoError, path, ": ", kIterationsKey, " is '", text, "', not a count");
  optimizer->set_iterations(iterations);
  if (const auto ls = data.metadata.find(kLossScaleKey); ls != data.metadata.end()) {
    if (!optimizer->loss_scale_options())
      DTRAIN_THROW(IoError, path, ": has a loss scale (", kLossScaleKey, ") but its optimizer's settings have none");
    std::istringstream in(ls->second);
    double scale = 0;
    std::int64_t good = -1;
    if (!(in >> scale >> good))
      DTRAIN_THROW(IoError, path, ": ", kLossScaleKey, " is '", ls->second, "', not a loss scale and its good steps");
    try {
      optim::check_loss_scale(*optimizer->loss_scale_options(), static_cast<float>(scale), good);
    } catch (const InvalidArgument& e) {
      DTRAIN_THROW(IoError, path, ": ", kLossScaleKey, ": ", e.what());
    }
    optimizer->set_loss_scale_state(static_cast<float>(scale), good);
  }

  // A variable the optimizer never updated (no gradient yet) has no slots in the file and
  // gets none; one that has any has all of them.
  std::set<std::string> used;
  const std::vector<std::string> names = optimizer->slot_names_in_order();
  for (Variable* v : model.variables()) {
    bool any = false;
    for (const std::string& s : names) any |= data.find(slot_key(*v, s)) != nullptr;
    if (!any) continue;
    auto slots = optimizer->slots(*v, /*create=*/true);
    for (auto& [name, slot] : slots) {
      const std::string key = slot_key(*v, name);
      slot->copy_from(tensor_like(path, data, key, slot->shape(), slot->dtype(),
                                  "the " + optimizer->name() + " slot '" + name + "' of variable '" + v->name() + "'"));
      used.insert(key);
    }
  }
  return used;
}

}  // namespace

void Model::save(const std::string& path) const {
  NamedTensors data;
  // Weights and slots on a GPU are written from host copies: the file does not depend on the device.
  for (Variable* v : variables()) data.tensors.emplace_back(v->name(), v->value().to(Device::cpu()));
  data.metadata[kModelKey] = to_json();
  json rng = json::object();
  for (const auto& l : layers_)
    if (auto state = l->rng_state(); !state.empty()) rng[l->name()] = state;
  if (!rng.empty()) data.metadata[kLayerRngKey] = rng.dump();
  if (compiled()) {
    // Serialized before anything is written, so that an optimizer or a loss with no JSON
    // form fails the save with the file untouched. One output keeps the plain form.
    json compile{{"optimizer", optimizer_to_json(*optimizer_)}};
    if (losses_.size() == 1 && loss_weights_.front() == 1.0) {
      compile["loss"] = loss_to_json(*loss_);
      compile["metrics"] = compiled_metrics_.front();
    } else {
      compile["loss"] = json::array();
      for (const auto& l : losses_) compile["loss"].push_back(loss_to_json(*l));
      compile["metrics"] = compiled_metrics_;
      compile["loss_weights"] = loss_weights_;
    }
    data.metadata[kCompileKey] = compile.dump();
    data.metadata[kIterationsKey] = std::to_string(optimizer_->iterations());
    if (optimizer_->loss_scale_options())
      data.metadata[kLossScaleKey] = std::to_string(double{optimizer_->loss_scale()}) + " " +
                                     std::to_string(optimizer_->loss_scale_good_steps());
    for (Variable* v : variables())
      for (const auto& [slot, t] : optimizer_->slots(*v)) data.tensors.emplace_back(slot_key(*v, slot), t->to(Device::cpu()));
  }
  save_checked(path, data);
}

namespace models {

std::unique_ptr<Model> load_model(const std::string& path, bool compile) {
  const auto not_a_model = [&](const NamedTensors& data) {
    DTRAIN_THROW(IoError, path, ": not a saved model: its __metadata__ has no \"", kModelKey,
                 "\" (the model's architecture, which model.save() writes); ", what_it_is(data));
  };
  NamedTensors data;
  try {
    data = load_checked(path);
  } catch (const IoError&) {
    // A file without checksums (save_weights') is told apart from a damaged model by what
    // its metadata holds; a damaged model keeps load_checked's error. The file is read
    // again only on this path.
    const NamedTensors plain = load_safetensors(path);
    if (!plain.metadata.count(kModelKey)) not_a_model(plain);
    throw;
  }
  if (!data.metadata.count(kModelKey)) not_a_model(data);

  const json model_json = json_part(path, data, kModelKey);
  std::unique_ptr<Model> model =
      reading(path, [&] { return model_from_json(model_json, std::string("__metadata__.") + kModelKey); });

  std::set<std::string> used;
  for (Variable* v : model->variables()) {
    v->assign(tensor_like(path, data, v->name(), v->shape(), v->dtype(), "the model's variable"));
    used.insert(v->name());
  }
  if (data.metadata.count(kLayerRngKey)) {
    const json rng = json_part(path, data, kLayerRngKey);
    if (!rng.is_object()) DTRAIN_THROW(IoError, path, ": ", kLayerRngKey, " is not a JSON object");
    for (const auto& l : model->layers()) {
      if (!rng.contains(l->name())) continue;
      const json& s = rng.at(l->name());
      if (!s.is_array()) DTRAIN_THROW(IoError, path, ": ", kLayerRngKey, "[\"", l->name(), "\"] is not an array");
      std::vector<std::uint64_t> state;
      for (const json& x : s) {
        if (!x.is_number_unsigned()) DTRAIN_THROW(IoError, path, ": ", kLayerRngKey, "[\"", l->name(), "\"] holds ", x.dump());
        state.push_back(x.get<std::uint64_t>());
      }
      reading(path, [&] {
        l->set_rng_state(state);
        return 0;
      });
    }
  }
  if (compile && data.metadata.count(kCompileKey)) used.merge(restore_compile(path, data, *model));

  // Every tensor must belong somewhere: a variable the model lacks means the architecture
  // and the weights disagree. Slots are left out only when not compiling.
  for (const auto& [name, t] : data.tensors) {
    if (used.count(name)) continue;
    if (is_slot_key(name) && !(compile && data.metadata.count(kCompileKey))) continue;
    DTRAIN_THROW(IoError, path, ": holds tensor '", name, "', which ",
                 is_slot_key(name) ? "is no slot of the optimizer's variables"
                                                   : "the model described in the file has no variable for");
  }
  return model;
}

bool is_slot_key(const std::string& name) { return name.starts_with(kSlotPrefix); }

}  // namespace models
}  // namespace dtrain
