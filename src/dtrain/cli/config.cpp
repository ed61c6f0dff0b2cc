// Config parsing: strict keys, typed values, paths in every message.
#include "dtrain/cli/config.h"

#include <fstream>
#include <sstream>

#include "dtrain/model/json_reader.h"
#include "dtrain/model/serialization.h"
#include "dtrain/nn/policy.h"

namespace dtrain::cli {
namespace {

using nlohmann::json;

// Prefixes an error from the library with the config file's name.
template <typename Fn>
auto in_file(const std::string& file, Fn&& fn) {
  try {
    return fn();
  } catch (const InvalidArgument& e) {
    DTRAIN_THROW(InvalidArgument, file, ": ", e.what());
  }
}

std::shared_ptr<optim::LearningRateSchedule> schedule_from(const JsonReader& r) {
  if (r.raw().is_number()) return std::make_shared<optim::Constant>(static_cast<float>(r.raw().get<double>()));
  r.expect_keys({"class_name", "config"});
  const std::string cls = r.get_string("class_name");
  const JsonReader c = r.child("config");
  if (cls == "ExponentialDecay") {
    c.expect_keys({"initial_learning_rate", "decay_steps", "decay_rate", "staircase"});
    return std::make_shared<optim::ExponentialDecay>(static_cast<float>(c.get_number("initial_learning_rate")),
                                                     c.get_int("decay_steps"), static_cast<float>(c.get_number("decay_rate")),
                                                     c.get_bool("staircase", false));
  }
  if (cls == "CosineDecay") {
    c.expect_keys({"initial_learning_rate", "decay_steps", "alpha"});
    return std::make_shared<optim::CosineDecay>(static_cast<float>(c.get_number("initial_learning_rate")),
                                                c.get_int("decay_steps"), static_cast<float>(c.get_number("alpha", 0.0)));
  }
  if (cls == "PiecewiseConstantDecay") {
    c.expect_keys({"boundaries", "values"});
    std::vector<std::int64_t> b;
    std::vector<float> v;
    const JsonReader bs = c.child("boundaries"), vs = c.child("values");
    bs.expect_array();
    vs.expect_array();
    for (const auto& x : bs.raw()) {
      if (!x.is_number_integer()) bs.fail("", "expected integers");
      b.push_back(x.get<std::int64_t>());
    }
    for (const auto& x : vs.raw()) {
      if (!x.is_number()) vs.fail("", "expected numbers");
      v.push_back(x.get<float>());
    }
    return std::make_shared<optim::PiecewiseConstantDecay>(b, v);
  }
  if (cls == "LinearWarmup") {
    c.expect_keys({"warmup_steps", "initial_learning_rate", "after"});
    return std::make_shared<optim::LinearWarmup>(schedule_from(c.child("after")), c.get_int("warmup_steps"),
                                                 static_cast<float>(c.get_number("initial_learning_rate", 0.0)));
  }
  r.fail("class_name", "unknown schedule '" + cls +
                           "' (expected ExponentialDecay, CosineDecay, PiecewiseConstantDecay or LinearWarmup)");
}

// "model": the JSON Sequential::to_json writes, or the short form {"input_shape", "layers"}.
json normalized_model(const JsonReader& r) {
  r.expect_object();
  if (r.has("class_name")) return r.raw();
  r.expect_keys({"name", "input_shape", "layers"});
  json config = {{"name", r.get_string("name", "sequential")}, {"layers", r.child("layers").raw()}};
  if (r.has("input_shape")) config["input_shape"] = r.child("input_shape").raw();
  return {{"class_name", "Sequential"}, {"config", config}};
}

}  // namespace

void check_strategy(const std::string& strategy, int replicas) {
  if (strategy != "default" && strategy != "one_device" && strategy != "mirrored" && strategy != "multi_worker")
    DTRAIN_THROW(InvalidArgument, "expected \"default\", \"one_device\", \"mirrored\" or \"multi_worker\", got \"",
                 strategy, "\"");
  if (replicas > 0 && strategy != "mirrored" && strategy != "multi_worker")
    DTRAIN_THROW(InvalidArgument, "replicas ", replicas, " needs strategy \"mirrored\" or \"multi_worker\", not \"",
                 strategy, "\"");
}

nlohmann::json read_json_file(const std::string& path, const std::string& unreadable) {
  std::ifstream in(path);
  if (!in) DTRAIN_THROW(IoError, unreadable);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

RunConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) DTRAIN_THROW(IoError, path, ": cannot open the config file");
  std::stringstream buf;
  buf << in.rdbuf();
  const json doc = parse_json(buf.str(), path);
  RunConfig c;
  c.file = path;
  in_file(path, [&] {
    const JsonReader r(doc, "");
    r.expect_keys({"model", "loss", "optimizer", "metrics", "data", "epochs", "batch_size", "seed", "threads",
                   "validation_split", "shuffle", "verbose", "dtype_policy", "strategy", "replicas",
                   "gradient_accumulation_steps"});
    c.model_json = normalized_model(r.child("model"));
    c.loss_json = r.child("loss").raw();
    c.optimizer_json = r.has("optimizer") ? r.child("optimizer").raw() : json("adam");
    if (r.has("metrics")) {
      const JsonReader m = r.child("metrics");
      m.expect_array();
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (!m.raw()[i].is_string()) m.element(i).fail("", "expected a metric name");
        c.metrics.push_back(m.raw()[i].get<std::string>());
      }
    }
    if (r.has("data")) {
      const JsonReader d = r.child("data");
      d.expect_keys({"source", "path", "samples", "test_samples", "features", "classes", "labels", "pipeline"});
      if (d.has("pipeline")) {
        const JsonReader p = d.child("pipeline");
        p.expect_keys({"cache", "shuffle", "prefetch", "drop_remainder"});
        PipelineConfig pc;
        pc.cache = p.get_bool("cache", false);
        pc.shuffle = p.get_int("shuffle", 0);
        pc.drop_remainder = p.get_bool("drop_remainder", false);
        if (p.has("prefetch")) {
          const auto& v = p.raw()["prefetch"];
          if (v.is_string() && v.get<std::string>() == "autotune") pc.prefetch = data::AUTOTUNE;
          else if (v.is_number_integer() && v.get<std::int64_t>() >= 0) pc.prefetch = v.get<std::int64_t>();
          else p.fail("prefetch", "expected \"autotune\" or a buffer size >= 0, got " + v.dump());
        }
        if (pc.shuffle < 0) p.fail("shuffle", "must be a buffer size >= 0 (0 = no shuffling)");
        c.data.pipeline = pc;
      }
      c.data.source = d.get_string("source", "synthetic");
      if (c.data.source != "fashion_mnist" && c.data.source != "synthetic")
        d.fail("source", "expected \"fashion_mnist\" or \"synthetic\", got \"" + c.data.source + "\"");
      c.data.path = d.get_string("path", "");
      c.data.samples = d.get_int("samples", c.data.samples);
      c.data.test_samples = d.get_int("test_samples", 0);
      c.data.features = d.get_int("features", c.data.features);
      c.data.classes = d.get_int("classes", c.data.classes);
      const std::string labels = d.get_string("labels", "random");
      if (labels == "teacher") c.data.labels = data::SyntheticLabels::teacher;
      else if (labels != "random") d.fail("labels", "expected \"random\" or \"teacher\", got \"" + labels + "\"");
      if (c.data.samples <= 0 || c.data.features <= 0 || c.data.classes <= 0 || c.data.test_samples < 0)
        d.fail("", "samples, features and classes must be positive and test_samples >= 0");
    }
    c.epochs = r.get_int32("epochs", 1, 0, 1'000'000);
    c.batch_size = r.get_int("batch_size", 32);
    const std::int64_t seed = r.get_int("seed", 0);
    if (seed < 0) r.fail("seed", "must be >= 0");
    c.seed = static_cast<std::uint64_t>(seed);
    c.threads = r.get_int32("threads", 0, 0, 4096);
    c.validation_split = r.get_number("validation_split", 0.0);
    c.shuffle = r.get_bool("shuffle", true);
    c.verbose = r.get_int32("verbose", -1, -1, 2);
    c.dtype_policy = r.get_string("dtype_policy", "");
    if (!c.dtype_policy.empty()) {
      try {
        nn::dtype_policy(c.dtype_policy);
      } catch (const InvalidArgument& e) {
        r.fail("dtype_policy", e.what());
      }
    }
    c.strategy = r.get_string("strategy", "default");
    c.replicas = r.get_int32("replicas", 0, 0, 4096);
    c.gradient_accumulation_steps = r.get_int32("gradient_accumulation_steps", 1, 1, 1'000'000);
    try {
      check_strategy(c.strategy, c.replicas);
    } catch (const InvalidArgument& e) {
      const bool replicas_wrong = c.replicas > 0 && c.strategy != "mirrored" && c.strategy != "multi_worker";
      r.fail(replicas_wrong ? "replicas" : "strategy", e.what());
    }
    if (c.batch_size <= 0 || c.batch_size > (std::int64_t{1} << 31)) r.fail("batch_size", "must be in [1, 2^31]");
    if (!(c.validation_split >= 0 && c.validation_split < 1)) r.fail("validation_split", "must be in [0, 1)");
    if (c.data.pipeline && c.validation_split > 0)
      r.fail("validation_split", "cannot be combined with data.pipeline; the pipeline trains on the whole training split");
    // Build the pieces once now, so that every error in them surfaces before training.
    build_model(c);
    build_loss(c);
    build_optimizer(c);
    return 0;
  });
  return c;
}

std::unique_ptr<Sequential> build_model(const RunConfig& c) {
  return in_file(c.file, [&] { return model_from_json(c.model_json, c.model_path, c.dtype_policy); });
}

std::shared_ptr<losses::Loss> build_loss(const RunConfig& c) {
  return in_file(c.file, [&]() -> std::shared_ptr<losses::Loss> {
    const JsonReader r(c.loss_json, "loss");
    if (c.loss_json.is_string()) return losses::get(c.loss_json.get<std::string>());
    r.expect_object();
    const std::string name = r.get_string("name");
    if (name == "categorical_crossentropy") r.expect_keys({"name", "from_logits", "label_smoothing", "reduction"});
    else if (name == "sparse_categorical_crossentropy") r.expect_keys({"name", "from_logits", "reduction"});
    else r.expect_keys({"name", "reduction"});
    const bool logits = r.get_bool("from_logits", false);
    const auto reduction = losses::reduction_from_name(r.get_string("reduction", "sum_over_batch_size"));
    if (name == "sparse_categorical_crossentropy")
      return std::make_shared<losses::SparseCategoricalCrossentropy>(logits, reduction);
    if (name == "categorical_crossentropy")
      return std::make_shared<losses::CategoricalCrossentropy>(logits, static_cast<float>(r.get_number("label_smoothing", 0)),
                                                               reduction);
    if (name == "mse" || name == "mean_squared_error") return std::make_shared<losses::MeanSquaredError>(reduction);
    r.fail("name", "unknown loss '" + name + "' (expected sparse_categorical_crossentropy, categorical_crossentropy or mse)");
  });
}

std::shared_ptr<optim::Optimizer> build_optimizer(const RunConfig& c) {
  return in_file(c.file, [&]() -> std::shared_ptr<optim::Optimizer> {
    if (c.optimizer_json.is_string()) return optim::get(c.optimizer_json.get<std::string>());
    const JsonReader r(c.optimizer_json, "optimizer");
    r.expect_object();
    const std::string name = r.get_string("name");
    if (name == "sgd")
      r.expect_keys({"name", "learning_rate", "momentum", "nesterov", "weight_decay", "clipnorm", "global_clipnorm"});
    else
      r.expect_keys({"name", "learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay", "clipnorm", "global_clipnorm"});
    optim::OptimizerOptions o;
    if (r.has("clipnorm")) o.clipnorm = static_cast<float>(r.get_number("clipnorm"));
    if (r.has("global_clipnorm")) o.global_clipnorm = static_cast<float>(r.get_number("global_clipnorm"));
    const float default_lr = name == "sgd" ? 0.01f : 0.001f;
    auto lr = r.has("learning_rate") ? schedule_from(r.child("learning_rate")) : std::make_shared<optim::Constant>(default_lr);
    if (name == "sgd") {
      o.weight_decay = static_cast<float>(r.get_number("weight_decay", 0.0));
      return std::make_shared<optim::SGD>(lr, static_cast<float>(r.get_number("momentum", 0.0)), r.get_bool("nesterov", false), o);
    }
    optim::AdamOptions a;
    a.beta_1 = static_cast<float>(r.get_number("beta_1", a.beta_1));
    a.beta_2 = static_cast<float>(r.get_number("beta_2", a.beta_2));
    a.epsilon = static_cast<float>(r.get_number("epsilon", a.epsilon));
    if (name == "adam") {
      o.weight_decay = static_cast<float>(r.get_number("weight_decay", 0.0));
      return std::make_shared<optim::Adam>(lr, a, o);
    }
    if (name == "adamw") return std::make_shared<optim::AdamW>(lr, static_cast<float>(r.get_number("weight_decay", 0.004)), a, o);
    r.fail("name", "unknown optimizer '" + name + "' (expected sgd, adam or adamw)");
  });
}

data::Dataset build_pipeline(const RunConfig& c, const data::Split& train) {
  const PipelineConfig& p = *c.data.pipeline;
  data::Dataset ds = data::Dataset::from_tensor_slices({train.x, train.y});
  if (p.cache) ds = ds.cache();
  if (p.shuffle > 0) ds = ds.shuffle(p.shuffle, c.seed);
  ds = ds.batch(c.batch_size, p.drop_remainder);
  if (p.prefetch != 0) ds = ds.prefetch(p.prefetch);
  return ds;
}

data::Classification load_data(const RunConfig& c) {
  if (c.data.source == "fashion_mnist") return data::load_fashion_mnist(c.data.path);
  data::Classification d;
  d.classes = c.data.classes;
  // Test data comes from the same generator, after the training rows.
  data::Split all = data::make_synthetic(c.data.samples + c.data.test_samples, c.data.features, c.data.classes, c.seed,
                                         c.data.labels);
  d.train = {all.x.slice(0, c.data.samples), all.y.slice(0, c.data.samples)};
  if (c.data.test_samples > 0)
    d.test = {all.x.slice(c.data.samples, c.data.samples + c.data.test_samples),
              all.y.slice(c.data.samples, c.data.samples + c.data.test_samples)};
  return d;
}

}  // namespace dtrain::cli
