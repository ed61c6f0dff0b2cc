// Model <-> Keras-like JSON. Layers are written with their Keras class names and configs;
// initializers as their string names (Keras accepts both strings and objects).
#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <unordered_map>

#include "dtrain/model/json_reader.h"
#include "dtrain/model/sequential.h"
#include "dtrain/model/serialization.h"

namespace dtrain {
namespace {

using nlohmann::json;

json seed_json(const std::optional<std::uint64_t>& seed) { return seed ? json(*seed) : json(nullptr); }

// A float as the shortest decimal that reads back as the same float (0.001, not
// 0.0010000000474974513).
json float_json(float f) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, f).ptr;
  return json(std::strtod(std::string(text, end).c_str(), nullptr));
}

// Keras's {"class_name": "L2", "config": {"l2": 0.01}}, or null.
json regularizer_json(const std::optional<nn::Regularizer>& r) {
  if (!r) return nullptr;
  json config = json::object();
  if (r->kind != nn::Regularizer::Kind::l2) config["l1"] = float_json(r->l1);
  if (r->kind != nn::Regularizer::Kind::l1) config["l2"] = float_json(r->l2);
  return {{"class_name", r->class_name()}, {"config", config}};
}

// Keras's {"class_name": "MaxNorm", "config": {"max_value": 2, "axis": 0}}, or null.
json constraint_json(const std::optional<Constraint>& c) {
  if (!c) return nullptr;
  json config = json::object();
  const json axis = c->axis.size() == 1 ? json(c->axis[0]) : json(c->axis);
  switch (c->kind) {
    case Constraint::Kind::max_norm: config = {{"max_value", float_json(c->max_value)}, {"axis", axis}}; break;
    case Constraint::Kind::unit_norm: config = {{"axis", axis}}; break;
    case Constraint::Kind::min_max_norm:
      config = {{"min_value", float_json(c->min_value)}, {"max_value", float_json(c->max_value)},
                {"rate", float_json(c->rate)}, {"axis", axis}};
      break;
    case Constraint::Kind::non_neg: break;
  }
  return {{"class_name", c->class_name()}, {"config", config}};
}

// The kernel-and-bias keys of Dense, Conv2D, DepthwiseConv2D ("depthwise") and
// MultiHeadAttention, as read_kernel_and_bias reads them back.
template <typename Options>
void write_kernel_and_bias(json& config, const Options& o, const std::string& kernel = "kernel") {
  config["use_bias"] = o.use_bias;
  config[kernel + "_initializer"] = o.kernel_initializer;
  config["bias_initializer"] = o.bias_initializer;
  config[kernel + "_regularizer"] = regularizer_json(o.kernel_regularizer);
  config["bias_regularizer"] = regularizer_json(o.bias_regularizer);
  config[kernel + "_constraint"] = constraint_json(o.kernel_constraint);
  config["bias_constraint"] = constraint_json(o.bias_constraint);
  config["seed"] = seed_json(o.seed);
}

json layer_to_json(const nn::Layer& layer) {
  json config = {{"name", layer.name()}, {"trainable", layer.trainable()}, {"dtype", layer.dtype_policy().name}};
  if (layer.activity_regularizer()) config["activity_regularizer"] = regularizer_json(layer.activity_regularizer());
  if (auto* d = dynamic_cast<const nn::Dense*>(&layer)) {
    const nn::DenseOptions& o = d->options();
    config["units"] = d->units();
    config["activation"] = d->activation().empty() ? "linear" : d->activation();
    write_kernel_and_bias(config, o);
  } else if (auto* a = dynamic_cast<const nn::Activation*>(&layer)) {
    config["activation"] = a->activation();
  } else if (auto* dr = dynamic_cast<const nn::Dropout*>(&layer)) {
    config["rate"] = dr->rate();
    config["seed"] = seed_json(dr->seed());
  } else if (dynamic_cast<const nn::Flatten*>(&layer)) {
  } else if (auto* s = dynamic_cast<const nn::Rescaling*>(&layer)) {
    config["scale"] = s->scale();
    config["offset"] = s->offset();
  } else if (auto* nz = dynamic_cast<const nn::Normalization*>(&layer)) {
    const std::vector<int>& axis = nz->axis();
    config["axis"] = axis.empty() ? json(nullptr) : axis.size() == 1 ? json(axis[0]) : json(axis);
    config["invert"] = nz->invert();
    config["mean"] = nz->mean().empty() ? json(nullptr) : json(nz->mean());
    config["variance"] = nz->variance().empty() ? json(nullptr) : json(nz->variance());
  } else if (auto* ce = dynamic_cast<const nn::CategoryEncoding*>(&layer)) {
    config["num_tokens"] = ce->num_tokens();
    config["output_mode"] = ce->output_mode();
    config["sparse"] = false;
  } else if (auto* rf = dynamic_cast<const nn::RandomFlip*>(&layer)) {
    config["mode"] = rf->mode();
    config["seed"] = seed_json(rf->seed());
    config["data_format"] = "channels_last";
  } else if (auto* rr = dynamic_cast<const nn::RandomRotation*>(&layer)) {
    config["factor"] = json::array({rr->lower(), rr->upper()});
    config["fill_mode"] = rr->fill_mode();
    config["interpolation"] = rr->interpolation();
    config["fill_value"] = float_json(rr->fill_value());
    config["seed"] = seed_json(rr->seed());
    config["data_format"] = "channels_last";
  } else if (auto* rc = dynamic_cast<const nn::RandomCrop*>(&layer)) {
    config["height"] = rc->height();
    config["width"] = rc->width();
    config["seed"] = seed_json(rc->seed());
    config["data_format"] = "channels_last";
  } else if (auto* c1 = dynamic_cast<const nn::Conv1D*>(&layer)) {
    const nn::Conv2DOptions& o = c1->options();
    config["filters"] = c1->filters();
    config["kernel_size"] = json::array({c1->kernel_length()});
    config["strides"] = json::array({o.strides[1]});
    config["padding"] = c1->padding();
    config["data_format"] = "channels_last";
    config["dilation_rate"] = json::array({o.dilation_rate[1]});
    config["groups"] = o.groups;
    config["activation"] = o.activation.empty() ? "linear" : o.activation;
    write_kernel_and_bias(config, o);
  } else if (auto* dw = dynamic_cast<const nn::DepthwiseConv2D*>(&layer)) {
    const nn::Conv2DOptions& o = dw->options();
    config["kernel_size"] = dw->kernel_size();
    config["strides"] = o.strides;
    config["padding"] = o.padding;
    config["depth_multiplier"] = dw->depth_multiplier();
    config["data_format"] = "channels_last";
    config["dilation_rate"] = o.dilation_rate;
    config["activation"] = o.activation.empty() ? "linear" : o.activation;
    write_kernel_and_bias(config, o, "depthwise");
  } else if (auto* cv = dynamic_cast<const nn::Conv2D*>(&layer)) {
    const nn::Conv2DOptions& o = cv->options();
    config["filters"] = cv->filters();
    config["kernel_size"] = cv->kernel_size();
    config["strides"] = o.strides;
    config["padding"] = o.padding;
    config["data_format"] = "channels_last";
    config["dilation_rate"] = o.dilation_rate;
    config["groups"] = o.groups;
    config["activation"] = o.activation.empty() ? "linear" : o.activation;
    write_kernel_and_bias(config, o);
  } else if (auto* p1 = dynamic_cast<const nn::Pooling1D*>(&layer)) {
    config["pool_size"] = json::array({p1->pool_size()[1]});
    config["strides"] = json::array({p1->strides()[1]});
    config["padding"] = p1->padding();
    config["data_format"] = "channels_last";
  } else if (auto* p = dynamic_cast<const nn::Pooling2D*>(&layer)) {
    config["pool_size"] = p->pool_size();
    config["strides"] = p->strides();
    config["padding"] = p->padding();
    config["data_format"] = "channels_last";
  } else if (auto* g = dynamic_cast<const nn::GlobalAveragePooling2D*>(&layer)) {
    config["data_format"] = "channels_last";
    config["keepdims"] = g->keepdims();
  } else if (auto* bn = dynamic_cast<const nn::BatchNormalization*>(&layer)) {
    const nn::BatchNormalizationOptions& o = bn->options();
    config["axis"] = o.axis;
    config["momentum"] = float_json(o.momentum);
    config["epsilon"] = float_json(o.epsilon);
    config["center"] = o.center;
    config["scale"] = o.scale;
    config["synchronized"] = o.synchronized;
    config["beta_initializer"] = o.beta_initializer;
    config["gamma_initializer"] = o.gamma_initializer;
    config["moving_mean_initializer"] = o.moving_mean_initializer;
    config["moving_variance_initializer"] = o.moving_variance_initializer;
    config["beta_regularizer"] = regularizer_json(o.beta_regularizer);
    config["gamma_regularizer"] = regularizer_json(o.gamma_regularizer);
    config["beta_constraint"] = constraint_json(o.beta_constraint);
    config["gamma_constraint"] = constraint_json(o.gamma_constraint);
  } else if (auto* ln = dynamic_cast<const nn::LayerNormalization*>(&layer)) {
    const nn::LayerNormalizationOptions& o = ln->options();
    config["axis"] = o.axis;
    config["epsilon"] = float_json(o.epsilon);
    config["center"] = o.center;
    config["scale"] = o.scale;
    config["beta_initializer"] = o.beta_initializer;
    config["gamma_initializer"] = o.gamma_initializer;
    config["beta_regularizer"] = regularizer_json(o.beta_regularizer);
    config["gamma_regularizer"] = regularizer_json(o.gamma_regularizer);
    config["beta_constraint"] = constraint_json(o.beta_constraint);
    config["gamma_constraint"] = constraint_json(o.gamma_constraint);
  } else if (auto* rs = dynamic_cast<const nn::Reshape*>(&layer)) {
    config["target_shape"] = rs->target_shape();
  } else if (auto* zp = dynamic_cast<const nn::ZeroPadding2D*>(&layer)) {
    config["padding"] = zp->padding();
    config["data_format"] = "channels_last";
  } else if (auto* em = dynamic_cast<const nn::Embedding*>(&layer)) {
    const nn::EmbeddingOptions& o = em->options();
    config["input_dim"] = em->input_dim();
    config["output_dim"] = em->output_dim();
    config["embeddings_initializer"] = o.embeddings_initializer;
    config["embeddings_regularizer"] = regularizer_json(o.embeddings_regularizer);
    config["embeddings_constraint"] = constraint_json(o.embeddings_constraint);
    config["mask_zero"] = o.mask_zero;
    config["seed"] = seed_json(o.seed);
  } else if (auto* pe = dynamic_cast<const nn::PositionEmbedding*>(&layer)) {
    config["sequence_length"] = pe->sequence_length();
    config["initializer"] = pe->initializer();
    config["seed"] = seed_json(pe->seed());
  } else if (auto* g1 = dynamic_cast<const nn::GlobalAveragePooling1D*>(&layer)) {
    config["data_format"] = "channels_last";
    config["keepdims"] = g1->keepdims();
  } else if (auto* mha = dynamic_cast<const nn::MultiHeadAttention*>(&layer)) {
    const nn::MultiHeadAttentionOptions& o = mha->options();
    config["num_heads"] = mha->num_heads();
    config["key_dim"] = mha->key_dim();
    config["value_dim"] = mha->value_dim();
    config["dropout"] = float_json(o.dropout);
    config["output_shape"] = o.output_shape > 0 ? json(o.output_shape) : json(nullptr);
    config["attention_axes"] = nullptr;
    write_kernel_and_bias(config, o);
  } else if (dynamic_cast<const nn::Add*>(&layer)) {
  } else if (auto* cc = dynamic_cast<const nn::Concatenate*>(&layer)) {
    config["axis"] = cc->axis();
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
    // Keras 3.15 writes the variance-scaling initializers' input_axes and output_axes.
    if (v.contains("config") && v["config"].is_object())
      for (const char* k : {"input_axes", "output_axes"})
        if (v["config"].contains(k) && !v["config"][k].is_null())
          r.fail(key + ".config." + k, "is not supported (only null), got " + v["config"][k].dump());
    // RandomNormal, RandomUniform and TruncatedNormal at Keras's defaults only.
    if (v.contains("config") && v["config"].is_object())
      for (const auto& [k, fixed] : {std::pair<const char*, double>{"mean", 0.0}, {"stddev", 0.05}, {"minval", -0.05},
                                     {"maxval", 0.05}})
        if (v["config"].contains(k) &&
            !(v["config"][k].is_number() && std::abs(v["config"][k].get<double>() - fixed) < 1e-9))
          r.fail(key + ".config." + k,
                 "is not supported (only Keras's default " + json(fixed).dump() + "), got " + v["config"][k].dump());
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

// Keras's pairs: an integer for both axes, or [height, width].
nn::Pair get_pair(const JsonReader& c, const std::string& key, std::optional<nn::Pair> fallback = std::nullopt) {
  if (!c.has(key)) {
    if (fallback) return *fallback;
    c.fail(key, "is required");
  }
  const json& v = c.raw()[key];
  if (v.is_number_integer()) return {v.get<std::int64_t>(), v.get<std::int64_t>()};
  if (v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer())
    return {v[0].get<std::int64_t>(), v[1].get<std::int64_t>()};
  c.fail(key, "expected an integer or a pair [height, width] of integers, got " + v.dump());
}

// A 1-D layer's size: an integer or a list of one, as Keras writes kernel_size, strides,
// pool_size and dilation_rate.
std::int64_t get_single(const JsonReader& c, const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) {
  if (!c.has(key) || c.raw()[key].is_null()) {
    if (fallback) return *fallback;
    c.fail(key, "is required");
  }
  const json& v = c.raw()[key];
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_array() && v.size() == 1 && v[0].is_number_integer()) return v[0].get<std::int64_t>();
  c.fail(key, "expected an integer or a list of one integer, got " + v.dump());
}

void expect_channels_last(const JsonReader& c) {
  if (c.has("data_format") && c.get_string("data_format") != "channels_last")
    c.fail("data_format", "only \"channels_last\" images ([batch, height, width, channels]) are supported, got \"" +
                              c.get_string("data_format") + "\"");
}

// Keys Keras writes as null where the feature is off (noise_shape, quantization_config,
// ...): a value dtrain cannot honour is one line naming the key and the value.
void expect_unset(const JsonReader& c, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (c.has(k)) c.fail(k, std::string("is not supported (only null), got ") + c.raw()[k].dump());
}

// The keys every layer's config may hold, as tf.keras 2 and Keras 3 write them, then the
// layer's own: tf.keras 2 writes the first layer's batch_input_shape, and dynamic where it
// is true (dtrain runs every layer eagerly); Keras 3.4+ writes activity_regularizer here
// where it is set.
std::vector<std::string> layer_keys(std::initializer_list<const char*> own) {
  std::vector<std::string> out{"name", "trainable", "dtype", "batch_input_shape", "batch_shape", "dynamic",
                               "activity_regularizer"};
  out.insert(out.end(), own.begin(), own.end());
  return out;
}

// A {"class_name", "config"} object as tf.keras 2 writes it, or Keras 3's with module and
// registered_name: its class name and config (empty when it has none).
std::pair<std::string, JsonReader> keras_object(const JsonReader& c, const std::string& key) {
  const JsonReader o = c.child(key);
  o.expect_keys({"class_name", "config", "module", "registered_name"});
  static const json kEmpty = json::object();
  return {o.get_string("class_name"), o.has("config") ? o.child("config") : JsonReader(kEmpty, o.key_path("config"))};
}

// tf.keras.regularizers: null, "l1" / "l2" / "l1_l2" (tf.keras 2: 0.01 each) / "l1l2"
// (Keras 3's snake case of L1L2: 0 each), or an L1, L2 or L1L2 object.
std::optional<nn::Regularizer> get_regularizer(const JsonReader& c, const std::string& key) {
  if (!c.has(key)) return std::nullopt;
  const json& v = c.raw()[key];
  if (v.is_string()) {
    const std::string name = v.get<std::string>();
    if (name == "l1l2") return nn::Regularizer::L1L2();
    try {
      return nn::Regularizer::from_name(name);
    } catch (const InvalidArgument& e) {
      c.fail(key, e.what());
    }
  }
  if (!v.is_object()) c.fail(key, "expected a regularizer: a name or {\"class_name\": ...}, got " + v.dump());
  const auto [cls, config] = keras_object(c, key);
  // L1 and L2 also took the old keyword "l".
  const double l = config.get_number("l", -1.0);
  if (cls == "L1" || cls == "l1") {
    config.expect_keys({"l1", "l"});
    return nn::Regularizer::L1(static_cast<float>(l >= 0 ? l : config.get_number("l1", 0.01)));
  }
  if (cls == "L2" || cls == "l2") {
    config.expect_keys({"l2", "l"});
    return nn::Regularizer::L2(static_cast<float>(l >= 0 ? l : config.get_number("l2", 0.01)));
  }
  if (cls == "L1L2" || cls == "l1_l2") {
    config.expect_keys({"l1", "l2"});
    return nn::Regularizer::L1L2(static_cast<float>(config.get_number("l1", 0.0)),
                                 static_cast<float>(config.get_number("l2", 0.0)));
  }
  c.fail(key + ".class_name", "unknown regularizer '" + cls + "' (expected L1, L2 or L1L2)");
}

// tf.keras.constraints: null, "max_norm" / "non_neg" / "unit_norm" / "min_max_norm", or a
// MaxNorm, NonNeg, UnitNorm or MinMaxNorm object.
std::optional<Constraint> get_constraint(const JsonReader& c, const std::string& key) {
  if (!c.has(key)) return std::nullopt;
  const json& v = c.raw()[key];
  if (v.is_string()) {
    try {
      return Constraint::from_name(v.get<std::string>());
    } catch (const InvalidArgument& e) {
      c.fail(key, e.what());
    }
  }
  if (!v.is_object()) c.fail(key, "expected a constraint: a name or {\"class_name\": ...}, got " + v.dump());
  const auto [cls, config] = keras_object(c, key);
  Constraint out;
  try {
    out = Constraint::from_name(cls);
  } catch (const InvalidArgument& e) {
    c.fail(key + ".class_name", e.what());
  }
  if (out.kind == Constraint::Kind::non_neg) {
    config.expect_keys({});
    return out;
  }
  if (config.has("axis")) {
    const json& a = config.raw()["axis"];
    out.axis.clear();
    if (a.is_number_integer()) {
      out.axis.push_back(a.get<int>());
    } else if (a.is_array() && !a.empty()) {
      for (const json& e : a) {
        if (!e.is_number_integer()) config.fail("axis", "expected an integer or a list of integers, got " + a.dump());
        out.axis.push_back(e.get<int>());
      }
    } else {
      config.fail("axis", "expected an integer or a list of integers, got " + a.dump());
    }
  }
  if (out.kind == Constraint::Kind::unit_norm) {
    config.expect_keys({"axis"});
  } else if (out.kind == Constraint::Kind::max_norm) {
    config.expect_keys({"max_value", "axis"});
    out.max_value = static_cast<float>(config.get_number("max_value", 2.0));
  } else {
    config.expect_keys({"min_value", "max_value", "rate", "axis"});
    out.min_value = static_cast<float>(config.get_number("min_value", 0.0));
    out.max_value = static_cast<float>(config.get_number("max_value", 1.0));
    out.rate = static_cast<float>(config.get_number("rate", 1.0));
  }
  return out;
}

// The layer's own "seed" (null or absent: none).
std::optional<std::uint64_t> get_seed(const JsonReader& c) {
  if (auto s = c.get_optional_int("seed")) return static_cast<std::uint64_t>(*s);
  return std::nullopt;
}

// The layer's own "seed", else the seed of its kernel's initializer object
// ({"class_name": "GlorotUniform", "config": {"seed": 3}}), which in Keras fixes the
// kernel's values whatever the global seed; a null seed is none.
std::optional<std::uint64_t> get_seed(const JsonReader& c, const std::string& kernel_key) {
  if (auto s = get_seed(c)) return s;
  if (!c.has(kernel_key)) return std::nullopt;
  const json& init = c.raw()[kernel_key];
  if (!init.is_object() || !init.contains("config") || !init["config"].is_object() || !init["config"].contains("seed"))
    return std::nullopt;
  const json& seed = init["config"]["seed"];
  if (seed.is_null()) return std::nullopt;
  if (!seed.is_number_integer() || seed.get<std::int64_t>() < 0)
    c.fail(kernel_key + ".config.seed", "expected a whole number >= 0 or null, got " + seed.dump());
  return seed.get<std::uint64_t>();
}

// The keys every layer with a kernel and a bias takes (Dense, Conv2D, MultiHeadAttention):
// `kernel` names the kernel's ("kernel", or DepthwiseConv2D's "depthwise").
template <typename Options>
void read_kernel_and_bias(const JsonReader& c, Options& o, const std::string& kernel = "kernel") {
  o.kernel_regularizer = get_regularizer(c, kernel + "_regularizer");
  o.bias_regularizer = get_regularizer(c, "bias_regularizer");
  o.kernel_constraint = get_constraint(c, kernel + "_constraint");
  o.bias_constraint = get_constraint(c, "bias_constraint");
  o.use_bias = c.get_bool("use_bias", true);
  o.kernel_initializer = initializer_name(c, kernel + "_initializer", "glorot_uniform");
  o.bias_initializer = initializer_name(c, "bias_initializer", "zeros");
  o.seed = get_seed(c, kernel + "_initializer");
}

std::shared_ptr<nn::Layer> make_conv_layer(const std::string& cls, const JsonReader& c) {
  const bool depthwise = cls == "DepthwiseConv2D";
  if (depthwise)
    c.expect_keys(layer_keys({"kernel_size", "strides", "padding", "depth_multiplier", "data_format", "dilation_rate",
                              "groups", "activation", "use_bias", "depthwise_initializer", "bias_initializer",
                              "depthwise_regularizer", "bias_regularizer", "depthwise_constraint", "bias_constraint",
                              "seed", "lora_rank", "lora_alpha"}));
  else
    c.expect_keys(layer_keys({"filters", "kernel_size", "strides", "padding", "data_format", "dilation_rate", "groups",
                              "activation", "use_bias", "kernel_initializer", "bias_initializer", "kernel_regularizer",
                              "bias_regularizer", "kernel_constraint", "bias_constraint", "seed", "lora_rank",
                              "lora_alpha"}));
  expect_channels_last(c);
  expect_unset(c, {"lora_rank", "lora_alpha"});
  nn::Conv2DOptions o;
  read_kernel_and_bias(c, o, depthwise ? "depthwise" : "kernel");
  const bool one_d = cls == "Conv1D";  // sizes of one axis: the second of Conv2D's pairs
  o.name = c.get_string("name", depthwise ? "depthwise_conv2d" : one_d ? "conv1d" : "conv2d");
  o.strides = one_d ? nn::Pair{1, get_single(c, "strides", 1)} : get_pair(c, "strides", nn::Pair{1, 1});
  o.padding = c.get_string("padding", "valid");
  o.dilation_rate = one_d ? nn::Pair{1, get_single(c, "dilation_rate", 1)} : get_pair(c, "dilation_rate", nn::Pair{1, 1});
  const std::string act = c.get_string("activation", "linear");
  o.activation = act == "linear" ? "" : act;
  if (one_d) {
    o.groups = c.get_int("groups", 1);
    return std::make_shared<nn::Conv1D>(c.get_int("filters"), get_single(c, "kernel_size"), o);
  }
  const nn::Pair kernel = get_pair(c, "kernel_size");
  if (depthwise) {
    if (c.get_int("groups", 1) != 1) c.fail("groups", "a DepthwiseConv2D takes groups 1 (tf.keras writes it so)");
    return std::make_shared<nn::DepthwiseConv2D>(kernel, c.get_int("depth_multiplier", 1), o);
  }
  o.groups = c.get_int("groups", 1);
  return std::make_shared<nn::Conv2D>(c.get_int("filters"), kernel, o);
}

// A layer from {"class_name", "config"}; "trainable": false freezes its weights once built.
std::shared_ptr<nn::Layer> layer_from_json(const JsonReader& r, const std::string& dtype_policy, bool in_graph = false) {
  // Keras 3 adds module, registered_name and build_config to every layer's entry.
  if (in_graph) r.expect_keys({"class_name", "config", "name", "inbound_nodes", "module", "registered_name", "build_config"});
  else r.expect_keys({"class_name", "config", "module", "registered_name", "build_config"});
  const std::string cls = r.get_string("class_name");
  static const json kNoConfig = json::object();  // outlives the reader that refers to it
  const JsonReader c = r.has("config") ? r.child("config") : JsonReader(kNoConfig, r.key_path("config"));
  c.expect_object();
  auto layer = make_layer(cls, c, r);
  if (!c.get_bool("trainable", true)) layer->set_trainable(false);
  layer->set_activity_regularizer(get_regularizer(c, "activity_regularizer"));
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
      c.expect_keys(layer_keys({"units", "activation", "use_bias", "kernel_initializer", "bias_initializer",
                                "kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint", "seed",
                                "quantization_config", "lora_rank", "lora_alpha"}));
      expect_unset(c, {"quantization_config", "lora_rank", "lora_alpha"});
      nn::DenseOptions o;
      read_kernel_and_bias(c, o);
      o.name = c.get_string("name", "dense");
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
      c.expect_keys(layer_keys({"activation"}));
      try {
        return std::make_shared<nn::Activation>(c.get_string("activation"), c.get_string("name", "activation"));
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find(c.key_path("activation")) == 0) throw;
        c.fail("activation", e.what());
      }
    }
    if (cls == "Dropout") {
      c.expect_keys(layer_keys({"rate", "seed", "noise_shape"}));
      expect_unset(c, {"noise_shape"});
      const std::optional<std::uint64_t> seed = get_seed(c);
      const double rate = c.get_number("rate");
      if (!(rate >= 0 && rate < 1)) c.fail("rate", "must be in [0, 1), got " + c.raw()["rate"].dump());
      return std::make_shared<nn::Dropout>(static_cast<float>(rate), seed, c.get_string("name", "dropout"));
    }
    if (cls == "Flatten") {
      c.expect_keys(layer_keys({"data_format"}));
      expect_channels_last(c);
      return std::make_shared<nn::Flatten>(c.get_string("name", "flatten"));
    }
    if (cls == "Conv2D" || cls == "DepthwiseConv2D" || cls == "Conv1D") return make_conv_layer(cls, c);
    if (cls == "Normalization") {
      c.expect_keys(layer_keys({"axis", "mean", "variance", "invert"}));
      // Keras's axis: an int, a list of them, or null (one mean and variance for all).
      std::vector<int> axis{-1};
      if (c.has("axis")) {
        const json& a = c.raw()["axis"];
        axis.clear();
        if (a.is_number_integer()) axis.push_back(a.get<int>());
        else if (a.is_array())
          for (const json& e : a) {
            if (!e.is_number_integer()) c.fail("axis", "expected an int, a list of ints or null, got " + a.dump());
            axis.push_back(e.get<int>());
          }
        else if (!a.is_null()) c.fail("axis", "expected an int, a list of ints or null, got " + a.dump());
      }
      const auto values = [&](const char* key) -> std::optional<std::vector<float>> {
        if (!c.has(key) || c.raw()[key].is_null()) return std::nullopt;
        const json& v = c.raw()[key];
        // A number, or (nested) lists of them in the kept axes' order, flattened.
        std::vector<float> out;
        const auto flatten = [&](const json& e, const auto& self) -> void {
          if (e.is_number()) out.push_back(e.get<float>());
          else if (e.is_array())
            for (const json& inner : e) self(inner, self);
          else c.fail(key, "expected a number or a list of numbers, got " + v.dump());
        };
        flatten(v, flatten);
        return out;
      };
      return std::make_shared<nn::Normalization>(values("mean"), values("variance"), c.get_bool("invert", false),
                                                 c.get_string("name", "normalization"), std::move(axis));
    }
    if (cls == "CategoryEncoding") {
      c.expect_keys(layer_keys({"num_tokens", "output_mode", "sparse"}));
      if (c.get_bool("sparse", false)) c.fail("sparse", "dtrain's outputs are dense (sparse false)");
      return std::make_shared<nn::CategoryEncoding>(c.get_int("num_tokens"), c.get_string("output_mode", "multi_hot"),
                                                    c.get_string("name", "category_encoding"));
    }
    if (cls == "RandomRotation") {
      c.expect_keys(layer_keys({"factor", "fill_mode", "interpolation", "seed", "fill_value", "data_format", "value_range"}));
      expect_channels_last(c);
      const json& f = c.raw().contains("factor") ? c.raw()["factor"] : json();
      double lower = 0, upper = 0;
      if (f.is_number()) {
        lower = -std::fabs(f.get<double>());
        upper = std::fabs(f.get<double>());
      } else if (f.is_array() && f.size() == 2 && f[0].is_number() && f[1].is_number()) {
        lower = f[0].get<double>();
        upper = f[1].get<double>();
      } else {
        c.fail("factor", "expected a number or a [lower, upper] pair (fractions of a full turn), got " + f.dump());
      }
      const std::optional<std::uint64_t> seed = get_seed(c);
      return std::make_shared<nn::RandomRotation>(lower, upper, c.get_string("fill_mode", "reflect"),
                                                  c.get_string("interpolation", "bilinear"), seed,
                                                  static_cast<float>(c.get_number("fill_value", 0.0)),
                                                  c.get_string("name", "random_rotation"));
    }
    if (cls == "RandomFlip" || cls == "RandomCrop") {
      if (cls == "RandomFlip") c.expect_keys(layer_keys({"mode", "seed", "data_format"}));
      else c.expect_keys(layer_keys({"height", "width", "seed", "data_format"}));
      expect_channels_last(c);
      const std::optional<std::uint64_t> seed = get_seed(c);
      if (cls == "RandomFlip")
        return std::make_shared<nn::RandomFlip>(c.get_string("mode", "horizontal_and_vertical"), seed,
                                                c.get_string("name", "random_flip"));
      return std::make_shared<nn::RandomCrop>(c.get_int("height"), c.get_int("width"), seed,
                                              c.get_string("name", "random_crop"));
    }
    if (cls == "MaxPooling1D" || cls == "AveragePooling1D") {
      c.expect_keys(layer_keys({"pool_size", "strides", "padding", "data_format"}));
      expect_channels_last(c);
      const std::int64_t pool = get_single(c, "pool_size", 2);
      const std::optional<std::int64_t> strides =
          c.has("strides") && !c.raw()["strides"].is_null() ? std::optional(get_single(c, "strides")) : std::nullopt;
      const std::string padding = c.get_string("padding", "valid");
      if (cls == "MaxPooling1D")
        return std::make_shared<nn::MaxPooling1D>(pool, strides, padding, c.get_string("name", "max_pooling1d"));
      return std::make_shared<nn::AveragePooling1D>(pool, strides, padding, c.get_string("name", "average_pooling1d"));
    }
    if (cls == "MaxPooling2D" || cls == "AveragePooling2D") {
      c.expect_keys(layer_keys({"pool_size", "strides", "padding", "data_format"}));
      expect_channels_last(c);
      const nn::Pair pool = get_pair(c, "pool_size", nn::Pair{2, 2});
      const std::optional<nn::Pair> strides = c.has("strides") ? std::optional(get_pair(c, "strides")) : std::nullopt;
      const std::string padding = c.get_string("padding", "valid");
      if (cls == "MaxPooling2D")
        return std::make_shared<nn::MaxPooling2D>(pool, strides, padding, c.get_string("name", "max_pooling2d"));
      return std::make_shared<nn::AveragePooling2D>(pool, strides, padding, c.get_string("name", "average_pooling2d"));
    }
    if (cls == "GlobalAveragePooling2D" || cls == "GlobalAveragePooling1D") {
      c.expect_keys(layer_keys({"data_format", "keepdims"}));
      expect_channels_last(c);
      const bool keepdims = c.get_bool("keepdims", false);
      if (cls == "GlobalAveragePooling1D")
        return std::make_shared<nn::GlobalAveragePooling1D>(keepdims, c.get_string("name", "global_average_pooling1d"));
      return std::make_shared<nn::GlobalAveragePooling2D>(keepdims, c.get_string("name", "global_average_pooling2d"));
    }
    if (cls == "BatchNormalization") {
      c.expect_keys(layer_keys({"axis", "momentum", "epsilon", "center", "scale", "synchronized", "beta_initializer",
                                "gamma_initializer", "moving_mean_initializer", "moving_variance_initializer",
                                "beta_regularizer", "gamma_regularizer", "beta_constraint", "gamma_constraint",
                                "renorm", "renorm_clipping", "renorm_momentum", "virtual_batch_size"}));
      if (c.get_bool("renorm", false)) c.fail("renorm", "true is not supported (batch renormalization; only false)");
      expect_unset(c, {"virtual_batch_size"});
      nn::BatchNormalizationOptions o;
      o.beta_regularizer = get_regularizer(c, "beta_regularizer");
      o.gamma_regularizer = get_regularizer(c, "gamma_regularizer");
      o.beta_constraint = get_constraint(c, "beta_constraint");
      o.gamma_constraint = get_constraint(c, "gamma_constraint");
      o.name = c.get_string("name", "batch_normalization");
      // Keras writes axis as an integer or a list of one.
      if (c.has("axis")) {
        const json& a = c.raw()["axis"];
        if (a.is_array() && a.size() == 1 && a[0].is_number_integer()) o.axis = a[0].get<int>();
        else o.axis = c.get_int32("axis", -1, -8, 8);
      }
      o.momentum = static_cast<float>(c.get_number("momentum", 0.99));
      o.epsilon = static_cast<float>(c.get_number("epsilon", 1e-3));
      o.center = c.get_bool("center", true);
      o.scale = c.get_bool("scale", true);
      o.synchronized = c.get_bool("synchronized", false);
      o.beta_initializer = initializer_name(c, "beta_initializer", "zeros");
      o.gamma_initializer = initializer_name(c, "gamma_initializer", "ones");
      o.moving_mean_initializer = initializer_name(c, "moving_mean_initializer", "zeros");
      o.moving_variance_initializer = initializer_name(c, "moving_variance_initializer", "ones");
      return std::make_shared<nn::BatchNormalization>(o);
    }
    if (cls == "LayerNormalization") {
      c.expect_keys(layer_keys({"axis", "epsilon", "center", "scale", "rms_scaling", "beta_initializer",
                                "gamma_initializer", "beta_regularizer", "gamma_regularizer", "beta_constraint",
                                "gamma_constraint"}));
      if (c.get_bool("rms_scaling", false)) c.fail("rms_scaling", "true is not supported (RMS scaling; only false)");
      nn::LayerNormalizationOptions o;
      o.beta_regularizer = get_regularizer(c, "beta_regularizer");
      o.gamma_regularizer = get_regularizer(c, "gamma_regularizer");
      o.beta_constraint = get_constraint(c, "beta_constraint");
      o.gamma_constraint = get_constraint(c, "gamma_constraint");
      o.name = c.get_string("name", "layer_normalization");
      if (c.has("axis")) {
        const json& a = c.raw()["axis"];
        if (a.is_array() && a.size() == 1 && a[0].is_number_integer()) o.axis = a[0].get<int>();
        else o.axis = c.get_int32("axis", -1, -8, 8);
      }
      o.epsilon = static_cast<float>(c.get_number("epsilon", 1e-3));
      o.center = c.get_bool("center", true);
      o.scale = c.get_bool("scale", true);
      o.beta_initializer = initializer_name(c, "beta_initializer", "zeros");
      o.gamma_initializer = initializer_name(c, "gamma_initializer", "ones");
      return std::make_shared<nn::LayerNormalization>(o);
    }
    if (cls == "Reshape") {
      c.expect_keys(layer_keys({"target_shape"}));
      const JsonReader t = c.child("target_shape");
      t.expect_array();
      std::vector<std::int64_t> target;
      for (std::size_t i = 0; i < t.size(); ++i) {
        if (!t.raw()[i].is_number_integer()) t.fail("", "expected integers, got " + t.raw().dump());
        target.push_back(t.raw()[i].get<std::int64_t>());
      }
      return std::make_shared<nn::Reshape>(target, c.get_string("name", "reshape"));
    }
    if (cls == "ZeroPadding2D") {
      c.expect_keys(layer_keys({"padding", "data_format"}));
      expect_channels_last(c);
      nn::ZeroPadding2D::Padding2 pad{{{1, 1}, {1, 1}}};
      if (c.has("padding")) {
        const json& v = c.raw()["padding"];
        if (v.is_array() && v.size() == 2 && v[0].is_array() && v[1].is_array() && v[0].size() == 2 &&
            v[1].size() == 2) {
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) {
              if (!v[i][j].is_number_integer()) c.fail("padding", "expected integers, got " + v.dump());
              pad[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = v[i][j].get<std::int64_t>();
            }
        } else {
          const nn::Pair p = get_pair(c, "padding");
          pad = {{{p[0], p[0]}, {p[1], p[1]}}};
        }
      }
      return std::make_shared<nn::ZeroPadding2D>(pad, c.get_string("name", "zero_padding2d"));
    }
    if (cls == "Embedding") {
      c.expect_keys(layer_keys({"input_dim", "output_dim", "embeddings_initializer", "embeddings_regularizer",
                                "embeddings_constraint", "mask_zero", "input_length", "sparse", "lora_rank",
                                "lora_alpha", "seed"}));
      expect_unset(c, {"lora_rank", "lora_alpha"});
      if (c.get_bool("sparse", false)) c.fail("sparse", "true is not supported (sparse gradients; only false)");
      nn::EmbeddingOptions o;
      o.embeddings_initializer = initializer_name(c, "embeddings_initializer", "uniform");
      o.embeddings_regularizer = get_regularizer(c, "embeddings_regularizer");
      o.embeddings_constraint = get_constraint(c, "embeddings_constraint");
      o.seed = get_seed(c, "embeddings_initializer");
      o.mask_zero = c.get_bool("mask_zero", false);
      o.name = c.get_string("name", "embedding");
      const std::int64_t in = c.get_int("input_dim"), out = c.get_int("output_dim");
      if (in <= 0 || out <= 0) c.fail("input_dim", "input_dim and output_dim must be positive integers");
      return std::make_shared<nn::Embedding>(in, out, o);
    }
    if (cls == "PositionEmbedding") {
      c.expect_keys(layer_keys({"sequence_length", "initializer", "seed"}));
      const std::int64_t n = c.get_int("sequence_length");
      if (n <= 0) c.fail("sequence_length", "must be a positive integer, got " + std::to_string(n));
      return std::make_shared<nn::PositionEmbedding>(n, initializer_name(c, "initializer", "glorot_uniform"),
                                                     get_seed(c, "initializer"), c.get_string("name", "position_embedding"));
    }
    if (cls == "MultiHeadAttention") {
      c.expect_keys(layer_keys({"num_heads", "key_dim", "value_dim", "dropout", "use_bias", "output_shape",
                                "attention_axes", "kernel_initializer", "bias_initializer", "kernel_regularizer",
                                "bias_regularizer", "kernel_constraint", "bias_constraint", "seed", "query_shape",
                                "key_shape", "value_shape", "flash_attention"}));
      if (c.has("attention_axes") && !c.raw()["attention_axes"].is_null()) {
        const json& axes = c.raw()["attention_axes"];
        if (!(axes.is_array() && axes.size() == 1 && axes[0].is_number_integer() && axes[0].get<int>() == 1))
          c.fail("attention_axes", "attention over the sequence axis only (null or [1]), got " + axes.dump());
      }
      nn::MultiHeadAttentionOptions o;
      o.name = c.get_string("name", "multi_head_attention");
      if (c.has("value_dim") && !c.raw()["value_dim"].is_null()) o.value_dim = c.get_int("value_dim");
      o.dropout = static_cast<float>(c.get_number("dropout", 0.0));
      if (c.has("output_shape") && !c.raw()["output_shape"].is_null()) {
        const json& os = c.raw()["output_shape"];
        if (os.is_number_integer()) o.output_shape = os.get<std::int64_t>();
        else if (os.is_array() && os.size() == 1 && os[0].is_number_integer()) o.output_shape = os[0].get<std::int64_t>();
        else c.fail("output_shape", "one number of output features, got " + os.dump());
      }
      read_kernel_and_bias(c, o);
      return std::make_shared<nn::MultiHeadAttention>(c.get_int("num_heads"), c.get_int("key_dim"), o);
    }
    if (cls == "Add") {
      c.expect_keys(layer_keys({}));
      return std::make_shared<nn::Add>(c.get_string("name", "add"));
    }
    if (cls == "Concatenate") {
      c.expect_keys(layer_keys({"axis"}));
      return std::make_shared<nn::Concatenate>(c.get_int32("axis", -1, -8, 8), c.get_string("name", "concatenate"));
    }
    if (cls == "Rescaling") {
      c.expect_keys(layer_keys({"scale", "offset"}));
      for (const char* k : {"scale", "offset"})
        if (c.has(k) && !c.raw()[k].is_number())
          c.fail(k, std::string("is one number for every channel in dtrain, got ") + c.raw()[k].dump());
      return std::make_shared<nn::Rescaling>(static_cast<float>(c.get_number("scale")),
                                             static_cast<float>(c.get_number("offset", 0.0)),
                                             c.get_string("name", "rescaling"));
    }
  } catch (const InvalidArgument& e) {
    if (std::string(e.what()).rfind(c.path(), 0) == 0) throw;  // already names its path
    DTRAIN_THROW(InvalidArgument, c.path(), ": ", e.what());
  }
  r.fail("class_name", "unknown layer class '" + cls +
                           "' (expected Dense, Activation, Dropout, Flatten, Rescaling, Normalization, CategoryEncoding, "
                           "RandomFlip, RandomCrop, RandomRotation, Conv1D, Conv2D, DepthwiseConv2D, MaxPooling1D, AveragePooling1D, "
                           "MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, BatchNormalization, "
                           "LayerNormalization, Reshape, ZeroPadding2D, Add, Concatenate, Embedding, "
                           "PositionEmbedding, MultiHeadAttention or GlobalAveragePooling1D)");
}

}  // namespace

namespace {

// A shape without the batch axis from a list of positive extents, skipping `skip` leading
// entries (a batch axis written as null).
Shape shape_from(const JsonReader& s, std::size_t skip) {
  s.expect_array();
  std::vector<std::int64_t> dims;
  for (std::size_t i = skip; i < s.size(); ++i) {
    const json& d = s.raw()[i];
    if (!d.is_number_integer() || d.get<std::int64_t>() <= 0)
      s.fail("", "expected positive integer extents, got " + s.raw().dump());
    dims.push_back(d.get<std::int64_t>());
  }
  return Shape(dims);
}

// What a node's call says beside its input tensors.
struct NodeCall {
  std::vector<std::pair<std::string, int>> inputs;  // (layer name, node index), in call order
  bool use_causal_mask = false;
  std::optional<std::pair<std::string, int>> attention_mask;  // a tensor given as attention_mask
};

void collect_history(const json& v, NodeCall& out);

// A node's call arguments beside its first inputs (tf.keras's kwargs dict, Keras 3's
// "kwargs"): tensors given as value and key (MultiHeadAttention's, after the query), a
// tensor given as attention_mask, use_causal_mask, and those that change nothing: training
// unset or false, the implicit masks Keras 3 records (made again from the layers),
// return_attention_scores false.
void read_call_kwargs(const json& kwargs, NodeCall& out) {
  if (kwargs.is_null()) return;
  if (!kwargs.is_object()) throw std::invalid_argument("call arguments are not an object: " + kwargs.dump());
  for (const char* tensor : {"value", "key"})
    if (kwargs.contains(tensor) && !kwargs.at(tensor).is_null()) collect_history(kwargs.at(tensor), out);
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "value" || k == "key") continue;
    if (k == "attention_mask" && !v.is_null()) {
      NodeCall mask;
      collect_history(v, mask);
      if (mask.inputs.size() != 1) throw std::invalid_argument("attention_mask is not one tensor: " + v.dump());
      out.attention_mask = mask.inputs.front();
      continue;
    }
    if (k == "use_causal_mask" && v.is_boolean()) {
      out.use_causal_mask = out.use_causal_mask || v.get<bool>();
      continue;
    }
    // Keras 3 records the implicit masks it passed (mask, query_mask, value_mask, key_mask):
    // dtrain makes them again from the layers (Embedding's mask_zero), so they are not read.
    const bool implicit_mask = k == "mask" || k == "query_mask" || k == "value_mask" || k == "key_mask";
    const bool harmless = ((k == "training" || k == "return_attention_scores") && (v.is_null() || v == false)) ||
                          implicit_mask || (k == "attention_mask" && v.is_null());
    if (!harmless)
      throw std::invalid_argument("a call with " + k + "=" + v.dump() +
                                  " is not supported (training false, return_attention_scores false, the implicit "
                                  "masks, attention_mask, use_causal_mask, value and key only)");
  }
}

// The (layer name, node index) pairs a node reads, from tf.keras's [[name, node, tensor,
// {kwargs}], ...] or Keras 3's {"args": [...keras tensors...], "kwargs": {}}.
void collect_history(const json& v, NodeCall& out) {
  if (v.is_object()) {
    if (v.contains("class_name") && v.at("class_name") == "__keras_tensor__") {
      const json* h = nullptr;
      if (v.contains("config") && v.at("config").is_object() && v.at("config").contains("keras_history"))
        h = &v.at("config").at("keras_history");
      if (!h || !h->is_array() || h->size() < 2 || !h->at(0).is_string() || !h->at(1).is_number_integer())
        throw std::invalid_argument("a __keras_tensor__ without a keras_history [layer, node, tensor]: " + v.dump());
      out.inputs.emplace_back(h->at(0).get<std::string>(), h->at(1).get<int>());
      return;
    }
    if (v.contains("args")) collect_history(v.at("args"), out);
    if (v.contains("kwargs")) read_call_kwargs(v.at("kwargs"), out);
    return;
  }
  if (v.is_array()) {
    if (v.size() >= 3 && v[0].is_string() && v[1].is_number_integer()) {
      out.inputs.emplace_back(v[0].get<std::string>(), v[1].get<int>());
      if (v.size() >= 4) read_call_kwargs(v[3], out);
      return;
    }
    for (const json& e : v) collect_history(e, out);
  }
}

NodeCall node_inputs(const JsonReader& node) {
  NodeCall out;
  try {
    collect_history(node.raw(), out);
  } catch (const std::exception& e) {
    node.fail("", std::string("is not a node of tf.keras's or Keras 3's format: ") + e.what());
  }
  if (out.inputs.empty()) node.fail("", "names no input tensor: " + node.raw().dump());
  return out;
}

// input_layers / output_layers: [[name, node, tensor], ...] or one [name, node, tensor].
std::vector<std::pair<std::string, int>> endpoints(const JsonReader& c, const std::string& key) {
  const JsonReader e = c.child(key);
  e.expect_array();
  std::vector<std::pair<std::string, int>> out;
  const json& v = e.raw();
  auto one = [&](const json& t) {
    if (!t.is_array() || t.size() < 2 || !t[0].is_string() || !t[1].is_number_integer())
      e.fail("", "expected [layer name, node index, tensor index] entries, got " + v.dump());
    out.emplace_back(t[0].get<std::string>(), t[1].get<int>());
  };
  if (!v.empty() && v[0].is_string()) one(v);
  else for (const json& t : v) one(t);
  if (out.empty()) e.fail("", "names no tensor");
  return out;
}

UnbuiltModel functional_from_json(const JsonReader& c, const std::string& dtype_policy) {
  c.expect_keys({"name", "layers", "input_layers", "output_layers", "trainable"});
  UnbuiltModel out;
  out.class_name = "Functional";
  out.name = c.get_string("name", "model");
  const JsonReader layers = c.child("layers");
  layers.expect_array();
  // Each layer's config and inbound nodes; Inputs become calls with no layer.
  std::unordered_map<std::string, std::size_t> by_name;  // entry index
  std::vector<std::vector<NodeCall>> inbound;  // [entry][node]
  std::vector<int> layer_of;  // [entry] index into out.layers, -1 for an InputLayer
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const JsonReader e = layers.element(i);
    e.expect_object();
    const std::string cls = e.get_string("class_name");
    std::string name;
    if (cls == "InputLayer") {
      e.expect_keys({"class_name", "config", "name", "inbound_nodes", "module", "registered_name"});
      const JsonReader ic = e.child("config");
      if (ic.has("type_spec"))
        ic.fail("type_spec", "an Input described by a TypeSpec is not supported; give its shape and dtype");
      ic.expect_keys(
          {"batch_input_shape", "batch_shape", "input_shape", "shape", "dtype", "sparse", "ragged", "name", "optional"});
      if (ic.get_bool("optional", false)) ic.fail("optional", "true is not supported (optional inputs; only false)");
      name = ic.get_string("name", e.get_string("name", "input"));
      UnbuiltModel::Call call;
      for (const char* key : {"batch_input_shape", "batch_shape"})
        if (ic.has(key)) call.input_shape = shape_from(ic.child(key), 1);
      for (const char* key : {"input_shape", "shape"})
        if (ic.has(key)) call.input_shape = shape_from(ic.child(key), 0);
      if (!call.input_shape) ic.fail("batch_input_shape", "an InputLayer needs its shape");
      if (ic.get_bool("sparse", false)) ic.fail("sparse", "true is not supported (sparse inputs; only false)");
      if (ic.get_bool("ragged", false)) ic.fail("ragged", "true is not supported (ragged inputs; only false)");
      call.name = name;
      if (ic.has("dtype")) {
        const std::string dt = ic.raw()["dtype"].is_string() ? ic.get_string("dtype") : "";
        // Integer inputs (token ids) are held as float32, as fit casts them: exact up to 2^24.
        if (dt == "uint8") call.dtype = DType::u8;
        else if (dt != "float32" && dt != "int32" && dt != "int64")
          ic.fail("dtype", "an Input takes float32, int32, int64 or uint8 rows, got " + ic.raw()["dtype"].dump());
      }
      out.calls.push_back(call);
      layer_of.push_back(-1);
      inbound.push_back({});
    } else {
      auto layer = layer_from_json(e, dtype_policy, /*in_graph=*/true);
      name = layer->name();
      layer_of.push_back(static_cast<int>(out.layers.size()));
      out.layers.push_back(layer);
      out.json_index.push_back(i);
      std::vector<NodeCall> nodes;
      if (e.has("inbound_nodes")) {
        const JsonReader in = e.child("inbound_nodes");
        in.expect_array();
        for (std::size_t k = 0; k < in.size(); ++k) {
          NodeCall call = node_inputs(in.element(k));
          // use_causal_mask is a call argument in Keras; dtrain keeps it with the layer.
          if (call.use_causal_mask) {
            auto* mha = dynamic_cast<nn::MultiHeadAttention*>(layer.get());
            if (!mha) in.element(k).fail("", "use_causal_mask on a layer that is not a MultiHeadAttention");
            mha->set_use_causal_mask(true);
          }
          if (call.attention_mask) {
            if (!dynamic_cast<nn::MultiHeadAttention*>(layer.get()))
              in.element(k).fail("", "attention_mask on a layer that is not a MultiHeadAttention");
            call.inputs.push_back(*call.attention_mask);  // the node's last input
          }
          nodes.push_back(std::move(call));
        }
      }
      inbound.push_back(nodes);
    }
    if (!by_name.emplace(name, i).second) layers.element(i).fail("name", "names a second layer '" + name + "'");
  }
  // Calls in an order where every input exists: (entry, node) -> call index.
  std::map<std::pair<std::string, int>, std::size_t> made;
  for (std::size_t i = 0; i < layers.size(); ++i)
    if (layer_of[i] < 0) made[{out.calls[made.size()].name, 0}] = made.size();
  std::vector<std::size_t> next(layers.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      while (next[i] < inbound[i].size()) {
        UnbuiltModel::Call call;
        call.layer = layer_of[i];
        call.attention_mask = inbound[i][next[i]].attention_mask.has_value();
        bool ready = true;
        for (const auto& ref : inbound[i][next[i]].inputs) {
          const auto it = made.find(ref);
          if (it == made.end()) {
            ready = false;
            break;
          }
          call.inputs.push_back(it->second);
        }
        if (!ready) break;
        made[{out.layers[static_cast<std::size_t>(layer_of[i])]->name(), static_cast<int>(next[i])}] = out.calls.size();
        out.calls.push_back(call);
        ++next[i];
        progress = true;
      }
    }
  }
  for (std::size_t i = 0; i < layers.size(); ++i)
    if (next[i] < inbound[i].size()) {
      std::string missing;
      for (const auto& ref : inbound[i][next[i]].inputs)
        if (!made.count(ref)) missing = ref.first + "' node " + std::to_string(ref.second);
      layers.element(i).fail("inbound_nodes", "node " + std::to_string(next[i]) + " reads layer '" + missing +
                                                  ", which no layer of the model makes (or only in a cycle)");
    }
  auto resolve = [&](const std::string& key) {
    std::vector<std::size_t> calls;
    for (const auto& ref : endpoints(c, key)) {
      const auto it = made.find(ref);
      if (it == made.end())
        c.fail(key, "names layer '" + ref.first + "' node " + std::to_string(ref.second) + ", which the model does not have");
      calls.push_back(it->second);
    }
    return calls;
  };
  out.inputs = resolve("input_layers");
  out.outputs = resolve("output_layers");
  for (std::size_t k : out.inputs)
    if (out.calls[k].layer >= 0) c.fail("input_layers", "names a layer that is not an InputLayer");
  out.input_shape = out.calls[out.inputs.front()].input_shape;
  return out;
}

}  // namespace

Shape UnbuiltModel::output_shape(const Shape& row) const {
  auto with_batch = [](const Shape& s) {
    std::vector<std::int64_t> dims{1};
    for (auto d : s.dims()) dims.push_back(d);
    return Shape(dims);
  };
  if (calls.empty()) {
    Shape s = with_batch(row);
    for (const auto& l : layers) s = l->compute_output_shape(s);
    return s;
  }
  std::vector<Shape> shapes(calls.size());
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const Call& call = calls[k];
    if (call.layer < 0) {
      shapes[k] = with_batch(k == inputs.front() ? row : *call.input_shape);
      continue;
    }
    std::vector<Shape> in;
    for (std::size_t j : call.inputs) in.push_back(shapes[j]);
    if (call.attention_mask) in.pop_back();  // not one of the layer's tensors
    shapes[k] = layers[static_cast<std::size_t>(call.layer)]->compute_output_shape_of(in);
  }
  return shapes[outputs.front()];
}

std::size_t UnbuiltModel::output_layer() const {
  if (calls.empty()) return layers.size() - 1;
  const int l = calls[outputs.front()].layer;
  return l < 0 ? 0 : static_cast<std::size_t>(l);
}

std::unique_ptr<Model> UnbuiltModel::build() {
  if (calls.empty()) {
    auto model = std::make_unique<Sequential>(name);
    for (auto& l : layers) model->add(l);
    if (input_shape) model->build(*input_shape);
    return model;
  }
  std::vector<KerasTensor> made(calls.size());
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const Call& call = calls[k];
    if (call.layer < 0) {
      made[k] = Input(*call.input_shape, call.name, call.dtype);
      continue;
    }
    std::vector<KerasTensor> in;
    for (std::size_t j : call.inputs) in.push_back(made[j]);
    const auto& layer = layers[static_cast<std::size_t>(call.layer)];
    if (call.attention_mask && in.size() < 3)
      DTRAIN_THROW(InvalidArgument, "model '", name, "': layer '", layer->name(),
                   "' is called with an attention_mask but without a query and a value");
    if (call.attention_mask)
      made[k] = call_attention(std::static_pointer_cast<nn::MultiHeadAttention>(layer), in[0], in[1],
                               in.size() > 3 ? in[2] : KerasTensor(), in.back());
    else made[k] = call_layer(layer, in);
  }
  std::vector<KerasTensor> ins, outs;
  for (std::size_t k : inputs) ins.push_back(made[k]);
  for (std::size_t k : outputs) outs.push_back(made[k]);
  return std::make_unique<Model>(ins, outs, name);
}

std::string Model::to_json(int indent) const {
  if (!functional()) {
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
  // tf.keras's functional format: each layer with the nodes that call it, each node a list
  // of the tensors it reads as [layer name, node index, tensor index, {}].
  std::unordered_map<const GraphNode*, int> node_index;  // a node's index among its layer's
  std::unordered_map<const nn::Layer*, int> calls;
  std::unordered_map<const nn::Layer*, json> inbound;
  json layers = json::array();
  auto ref = [&](const KerasTensor& t) { return json::array({t.name(), node_index.at(t.node().get()), 0, json::object()}); };
  for (const auto& n : graph_) {
    if (!n->layer) {
      node_index[n.get()] = 0;
      json shape = json::array({nullptr});
      for (int d = 1; d < n->shape.rank(); ++d) shape.push_back(n->shape[d]);
      layers.push_back({{"class_name", "InputLayer"},
                        {"config", {{"batch_input_shape", shape}, {"dtype", dtype_name(n->dtype)}, {"sparse", false},
                                    {"ragged", false}, {"name", n->name}}},
                        {"name", n->name},
                        {"inbound_nodes", json::array()}});
      continue;
    }
    node_index[n.get()] = calls[n->layer.get()]++;
    json node = json::array();
    const std::size_t tensors = n->inputs.size() - (n->attention_mask ? 1 : 0);
    for (std::size_t i = 0; i < tensors; ++i) node.push_back(ref(n->inputs[i]));
    if (n->attention_mask) {
      const KerasTensor& m = n->inputs.back();
      node[0][3]["attention_mask"] = json::array({m.name(), node_index.at(m.node().get()), 0});
    }
    if (auto* mha = dynamic_cast<const nn::MultiHeadAttention*>(n->layer.get()); mha && mha->options().use_causal_mask)
      node[0][3]["use_causal_mask"] = true;
    inbound[n->layer.get()].push_back(node);
  }
  for (const auto& l : layers_) {
    json entry = layer_to_json(*l);
    entry["name"] = l->name();
    entry["inbound_nodes"] = inbound[l.get()];
    layers.push_back(entry);
  }
  json ins = json::array(), outs = json::array();
  for (const KerasTensor& t : inputs_) ins.push_back({t.name(), node_index.at(t.node().get()), 0});
  for (const KerasTensor& t : outputs_) outs.push_back({t.name(), node_index.at(t.node().get()), 0});
  json config = {{"name", name_}, {"layers", layers}, {"input_layers", ins}, {"output_layers", outs}};
  return json{{"class_name", "Functional"}, {"config", config}}.dump(indent);
}

UnbuiltModel unbuilt_model_from_json(const nlohmann::json& value, const std::string& path,
                                     const std::string& dtype_policy, const std::string& config_path) {
  const JsonReader r(value, path);
  // tf.keras 2's to_json() adds keras_version and backend; Keras 3 module,
  // registered_name, build_config and compile_config (a .keras archive's config.json too).
  r.expect_keys({"class_name", "config", "module", "registered_name", "build_config", "compile_config",
                 "keras_version", "backend"});
  const std::string cls = r.get_string("class_name");
  const JsonReader c(r.child("config").raw(), config_path.empty() ? r.key_path("config") : config_path);
  if (cls == "Functional" || cls == "Model") return functional_from_json(c, dtype_policy);
  if (cls != "Sequential")
    r.fail("class_name", "expected a Sequential or a Functional model, got '" + cls + "'");
  c.expect_keys({"name", "layers", "build_input_shape", "input_shape", "trainable", "dtype", "activity_regularizer"});
  expect_unset(c, {"activity_regularizer"});
  UnbuiltModel out;
  out.class_name = "Sequential";
  out.name = c.get_string("name", "sequential");
  const JsonReader layers = c.child("layers");
  layers.expect_array();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    // Keras 3 writes a Sequential's input as an InputLayer entry first.
    const JsonReader e = layers.element(i);
    if (e.raw().is_object() && e.raw().value("class_name", "") == "InputLayer") {
      const JsonReader ic = e.child("config");
      for (const char* key : {"batch_input_shape", "batch_shape"})
        if (ic.has(key)) out.input_shape = shape_from(ic.child(key), 1);
      continue;
    }
    out.layers.push_back(layer_from_json(e, dtype_policy));
    out.json_index.push_back(i);
    // tf.keras 2 writes the input's shape on the first layer too (batch_input_shape).
    if (out.layers.size() == 1 && !out.input_shape && e.has("config"))
      for (const char* key : {"batch_input_shape", "batch_shape"})
        if (e.child("config").has(key)) out.input_shape = shape_from(e.child("config").child(key), 1);
  }
  // build_input_shape includes the batch axis (null); input_shape does not.
  for (const char* key : {"build_input_shape", "input_shape"}) {
    if (!c.has(key)) continue;
    const Shape dims = shape_from(c.child(key), std::string(key) == "build_input_shape" ? 1 : 0);
    if (out.input_shape && *out.input_shape != dims)
      c.child(key).fail("", "gives rows of shape " + dims.to_string() + ", but build_input_shape gives " +
                                out.input_shape->to_string());
    out.input_shape = dims;
  }
  return out;
}

std::unique_ptr<Model> model_from_json(const nlohmann::json& value, const std::string& path,
                                       const std::string& dtype_policy, const std::string& config_path) {
  return unbuilt_model_from_json(value, path, dtype_policy, config_path).build();
}

std::shared_ptr<nn::Layer> layer_from_json(const nlohmann::json& entry, const std::string& path) {
  return layer_from_json(JsonReader(entry, path), "");
}

std::optional<nn::Regularizer> regularizer_from_json(const nlohmann::json& config, const std::string& key,
                                                     const std::string& path) {
  return get_regularizer(JsonReader(config, path), key);
}

std::optional<Constraint> constraint_from_json(const nlohmann::json& config, const std::string& key,
                                               const std::string& path) {
  return get_constraint(JsonReader(config, path), key);
}

nlohmann::json constraint_to_json(const std::optional<Constraint>& constraint) { return constraint_json(constraint); }

std::unique_ptr<Model> model_from_json(const std::string& text) {
  return model_from_json(parse_json(text, "model JSON"), "");
}

}  // namespace dtrain
