// Model <-> Keras-like JSON. Layers are written with their Keras class names and configs;
// initializers as their string names (Keras accepts both strings and objects).
#include <nlohmann/json.hpp>

#include "dtrain/model/json_reader.h"
#include "dtrain/model/serialization.h"

namespace dtrain {
namespace {

using nlohmann::json;

json seed_json(const std::optional<std::uint64_t>& seed) { return seed ? json(*seed) : json(nullptr); }

json layer_to_json(const nn::Layer& layer) {
  json config = {{"name", layer.name()}, {"trainable", layer.trainable()}, {"dtype", layer.dtype_policy().name}};
  if (auto* d = dynamic_cast<const nn::Dense*>(&layer)) {
    config["units"] = d->units();
    config["activation"] = d->activation().empty() ? "linear" : d->activation();
    config["use_bias"] = d->options().use_bias;
    config["kernel_initializer"] = d->options().kernel_initializer;
    config["bias_initializer"] = d->options().bias_initializer;
    config["seed"] = seed_json(d->options().seed);
  } else if (auto* a = dynamic_cast<const nn::Activation*>(&layer)) {
    config["activation"] = a->activation();
  } else if (auto* dr = dynamic_cast<const nn::Dropout*>(&layer)) {
    config["rate"] = dr->rate();
    config["seed"] = dr->seed() ? json(*dr->seed()) : json(nullptr);
  } else if (dynamic_cast<const nn::Flatten*>(&layer)) {
  } else if (auto* s = dynamic_cast<const nn::Rescaling*>(&layer)) {
    config["scale"] = s->scale();
    config["offset"] = s->offset();
  } else {
    DTRAIN_THROW(InvalidArgument, "layer '", layer.name(), "' (", layer.class_name(), ") cannot be written to JSON");
  }
  return {{"class_name", layer.class_name()}, {"config", config}};
}

// An initializer as a string or as Keras's {"class_name": "GlorotUniform", "config": {...}}.
std::string initializer_name(const JsonReader& r, const std::string& key, const std::string& fallback) {
  if (!r.has(key)) return fallback;
  const json& v = r.raw()[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("class_name") && v["class_name"].is_string()) {
    // GlorotUniform -> glorot_uniform
    std::string out;
    for (char c : v["class_name"].get<std::string>()) {
      if (std::isupper(static_cast<unsigned char>(c)) && !out.empty()) out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return out;
  }
  r.fail(key, "expected an initializer name or {\"class_name\": ...}, got " + v.dump());
}

std::shared_ptr<nn::Layer> make_layer(const std::string& cls, const JsonReader& c, const JsonReader& r);

// A layer from {"class_name", "config"}; "trainable": false freezes its weights once built.
std::shared_ptr<nn::Layer> layer_from_json(const JsonReader& r, const std::string& dtype_policy) {
  r.expect_keys({"class_name", "config"});
  const std::string cls = r.get_string("class_name");
  static const json kNoConfig = json::object();  // outlives the reader that refers to it
  const JsonReader c = r.has("config") ? r.child("config") : JsonReader(kNoConfig, r.key_path("config"));
  c.expect_object();
  auto layer = make_layer(cls, c, r);
  if (!c.get_bool("trainable", true)) layer->set_trainable(false);
  // "dtype": a policy name, or Keras 3's {"class_name": "DTypePolicy", "config": {"name": ...}};
  // without one the layer keeps the global policy. An override replaces both.
  if (!dtype_policy.empty() || c.has("dtype")) {
    const std::string name = !dtype_policy.empty()          ? dtype_policy
                             : c.raw()["dtype"].is_object() ? c.child("dtype").child("config").get_string("name")
                                                            : c.get_string("dtype");
    try {
      layer->set_dtype_policy(name);
    } catch (const InvalidArgument& e) {
      c.fail("dtype", e.what());
    }
  }
  return layer;
}

std::shared_ptr<nn::Layer> make_layer(const std::string& cls, const JsonReader& c, const JsonReader& r) {
  try {
    if (cls == "Dense") {
      c.expect_keys({"name", "trainable", "dtype", "units", "activation", "use_bias", "kernel_initializer",
                     "bias_initializer", "seed"});
      nn::DenseOptions o;
      o.name = c.get_string("name", "dense");
      o.use_bias = c.get_bool("use_bias", true);
      o.kernel_initializer = initializer_name(c, "kernel_initializer", "glorot_uniform");
      o.bias_initializer = initializer_name(c, "bias_initializer", "zeros");
      if (auto s = c.get_optional_int("seed")) o.seed = static_cast<std::uint64_t>(*s);
      std::string act = c.get_string("activation", "linear");
      const std::int64_t units = c.get_int("units");
      if (units <= 0) c.fail("units", "must be a positive integer, got " + std::to_string(units));
      try {
        return std::make_shared<nn::Dense>(units, act == "linear" ? "" : act, o);
      } catch (const InvalidArgument& e) {
        // The layer checks its names itself: an unknown activation or initializer.
        const std::string m = e.what();
        if (m.find("activation") != std::string::npos) c.fail("activation", m);
        if (m.find("initializer") != std::string::npos)
          c.fail(m.find("'" + o.bias_initializer + "'") != std::string::npos ? "bias_initializer" : "kernel_initializer", m);
        throw;
      }
    }
    if (cls == "Activation") {
      c.expect_keys({"name", "trainable", "dtype", "activation"});
      try {
        return std::make_shared<nn::Activation>(c.get_string("activation"), c.get_string("name", "activation"));
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find(c.key_path("activation")) == 0) throw;
        c.fail("activation", e.what());
      }
    }
    if (cls == "Dropout") {
      c.expect_keys({"name", "trainable", "dtype", "rate", "seed"});
      std::optional<std::uint64_t> seed;
      if (auto s = c.get_optional_int("seed")) seed = static_cast<std::uint64_t>(*s);
      const double rate = c.get_number("rate");
      if (!(rate >= 0 && rate < 1)) c.fail("rate", "must be in [0, 1), got " + c.raw()["rate"].dump());
      return std::make_shared<nn::Dropout>(static_cast<float>(rate), seed, c.get_string("name", "dropout"));
    }
    if (cls == "Flatten") {
      c.expect_keys({"name", "trainable", "dtype"});
      return std::make_shared<nn::Flatten>(c.get_string("name", "flatten"));
    }
    if (cls == "Rescaling") {
      c.expect_keys({"name", "trainable", "dtype", "scale", "offset"});
      return std::make_shared<nn::Rescaling>(static_cast<float>(c.get_number("scale")),
                                             static_cast<float>(c.get_number("offset", 0.0)),
                                             c.get_string("name", "rescaling"));
    }
  } catch (const InvalidArgument& e) {
    if (std::string(e.what()).rfind(c.path(), 0) == 0) throw;  // already names its path
    DTRAIN_THROW(InvalidArgument, c.path(), ": ", e.what());
  }
  r.fail("class_name", "unknown layer class '" + cls + "' (expected Dense, Activation, Dropout, Flatten or Rescaling)");
}

}  // namespace

std::string Sequential::to_json(int indent) const {
  json layers = json::array();
  for (const auto& l : layers_) layers.push_back(layer_to_json(*l));
  json config = {{"name", name_}, {"layers", layers}};
  if (input_shape_) {
    json shape = json::array({nullptr});
    for (auto d : input_shape_->dims()) shape.push_back(d);
    config["build_input_shape"] = shape;
  }
  return json{{"class_name", "Sequential"}, {"config", config}}.dump(indent);
}

UnbuiltModel unbuilt_model_from_json(const nlohmann::json& value, const std::string& path,
                                     const std::string& dtype_policy, const std::string& config_path) {
  const JsonReader r(value, path);
  r.expect_keys({"class_name", "config"});
  if (r.get_string("class_name") != "Sequential")
    r.fail("class_name", "only Sequential models are supported, got '" + r.get_string("class_name") + "'");
  const JsonReader c(r.child("config").raw(), config_path.empty() ? r.key_path("config") : config_path);
  c.expect_keys({"name", "layers", "build_input_shape", "input_shape"});
  UnbuiltModel out;
  out.model = std::make_unique<Sequential>(c.get_string("name", "sequential"));
  const JsonReader layers = c.child("layers");
  layers.expect_array();
  for (std::size_t i = 0; i < layers.size(); ++i) out.model->add(layer_from_json(layers.element(i), dtype_policy));
  // build_input_shape includes the batch axis (null); input_shape does not.
  for (const char* key : {"build_input_shape", "input_shape"}) {
    if (!c.has(key)) continue;
    const JsonReader s = c.child(key);
    s.expect_array();
    std::vector<std::int64_t> dims;
    for (std::size_t i = std::string(key) == "build_input_shape" ? 1 : 0; i < s.size(); ++i) {
      const json& d = s.raw()[i];
      if (!d.is_number_integer() || d.get<std::int64_t>() <= 0)
        s.fail("", "expected positive integer extents, got " + s.raw().dump());
      dims.push_back(d.get<std::int64_t>());
    }
    if (out.input_shape && *out.input_shape != Shape(dims))
      s.fail("", "gives rows of shape " + Shape(dims).to_string() + ", but build_input_shape gives " +
                     out.input_shape->to_string());
    out.input_shape = Shape(dims);
  }
  return out;
}

std::unique_ptr<Sequential> model_from_json(const nlohmann::json& value, const std::string& path,
                                            const std::string& dtype_policy, const std::string& config_path) {
  UnbuiltModel m = unbuilt_model_from_json(value, path, dtype_policy, config_path);
  if (m.input_shape) m.model->build(*m.input_shape);
  return std::move(m.model);
}

std::unique_ptr<Sequential> model_from_json(const std::string& text) {
  return model_from_json(parse_json(text, "model JSON"), "");
}

}  // namespace dtrain
