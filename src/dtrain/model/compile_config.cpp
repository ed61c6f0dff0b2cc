// Optimizers, losses and learning-rate schedules from JSON (compile_config.h).
#include "dtrain/model/compile_config.h"

#include <cmath>
#include <exception>

#include "dtrain/model/json_reader.h"

namespace dtrain {
namespace {

using nlohmann::json;

// Runs fn; an InvalidArgument from a constructor (which knows no JSON path) is reported at
// `r`'s path, and one that names a path under it already passes unchanged.
template <typename Fn>
auto at_path(const JsonReader& r, Fn&& fn) {
  try {
    return fn();
  } catch (const InvalidArgument& e) {
    if (names_json_path(e.what(), r.path())) throw;
    r.fail("", e.what());
  }
}

std::shared_ptr<optim::LearningRateSchedule> schedule_of(const JsonReader& r) {
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
    return std::make_shared<optim::LinearWarmup>(schedule_from_json(c.child("after").raw(), c.key_path("after")),
                                                 c.get_int("warmup_steps"),
                                                 static_cast<float>(c.get_number("initial_learning_rate", 0.0)));
  }
  r.fail("class_name", "unknown schedule '" + cls +
                           "' (expected ExponentialDecay, CosineDecay, PiecewiseConstantDecay or LinearWarmup)");
}

}  // namespace

std::shared_ptr<optim::LearningRateSchedule> schedule_from_json(const json& value, const std::string& path) {
  const JsonReader r(value, path);
  if (value.is_number()) {
    const double lr = value.get<double>();
    if (!(lr >= 0) || !std::isfinite(static_cast<float>(lr))) r.fail("", "must be a finite number >= 0, got " + value.dump());
    return std::make_shared<optim::Constant>(static_cast<float>(lr));
  }
  if (!value.is_object())
    r.fail("", "expected a number or a schedule {\"class_name\": \"ExponentialDecay\", \"config\": {...}}, got " +
                   value.dump());
  r.expect_keys({"class_name", "config"});
  return at_path(r, [&] { return schedule_of(r); });
}

std::shared_ptr<optim::Optimizer> optimizer_from_json(const json& value, const std::string& path) {
  const JsonReader r(value, path);
  if (value.is_string())
    return at_path(r, [&] { return std::shared_ptr<optim::Optimizer>(optim::get(value.get<std::string>())); });
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
  auto lr = r.has("learning_rate") ? schedule_from_json(r.child("learning_rate").raw(), r.key_path("learning_rate"))
                                   : std::make_shared<optim::Constant>(default_lr);
  // An optimizer's own check (SGD's momentum range, ...) is reported at the key it names.
  const auto at_key = [&](auto make) -> std::shared_ptr<optim::Optimizer> {
    try {
      return make();
    } catch (const InvalidArgument& e) {
      for (const char* key : {"momentum", "beta_1", "beta_2", "epsilon", "weight_decay", "global_clipnorm", "clipnorm"})
        if (r.has(key) && std::string(e.what()).find(key) != std::string::npos) r.fail(key, e.what());
      r.fail("", e.what());
    }
  };
  if (name == "sgd") {
    o.weight_decay = static_cast<float>(r.get_number("weight_decay", 0.0));
    return at_key([&] {
      return std::make_shared<optim::SGD>(lr, static_cast<float>(r.get_number("momentum", 0.0)), r.get_bool("nesterov", false), o);
    });
  }
  optim::AdamOptions a;
  a.beta_1 = static_cast<float>(r.get_number("beta_1", a.beta_1));
  a.beta_2 = static_cast<float>(r.get_number("beta_2", a.beta_2));
  a.epsilon = static_cast<float>(r.get_number("epsilon", a.epsilon));
  if (name == "adam") {
    o.weight_decay = static_cast<float>(r.get_number("weight_decay", 0.0));
    return at_key([&] { return std::make_shared<optim::Adam>(lr, a, o); });
  }
  if (name == "adamw")
    return at_key([&] {
      return std::make_shared<optim::AdamW>(lr, static_cast<float>(r.get_number("weight_decay", 0.004)), a, o);
    });
  r.fail("name", "unknown optimizer '" + name + "' (expected sgd, adam or adamw)");
}

std::shared_ptr<losses::Loss> loss_from_json(const json& value, const std::string& path) {
  const JsonReader r(value, path);
  if (value.is_string())
    return at_path(r, [&] { return std::shared_ptr<losses::Loss>(losses::get(value.get<std::string>())); });
  r.expect_object();
  const std::string name = r.get_string("name");
  if (name == "categorical_crossentropy") r.expect_keys({"name", "from_logits", "label_smoothing", "reduction"});
  else if (name == "sparse_categorical_crossentropy") r.expect_keys({"name", "from_logits", "reduction"});
  else r.expect_keys({"name", "reduction"});
  const bool logits = r.get_bool("from_logits", false);
  auto reduction = losses::Reduction::sum_over_batch_size;
  if (r.has("reduction"))
    reduction = at_path(r.child("reduction"), [&] { return losses::reduction_from_name(r.get_string("reduction")); });
  return at_path(r, [&]() -> std::shared_ptr<losses::Loss> {
    if (name == "sparse_categorical_crossentropy")
      return std::make_shared<losses::SparseCategoricalCrossentropy>(logits, reduction);
    if (name == "categorical_crossentropy")
      return std::make_shared<losses::CategoricalCrossentropy>(logits, static_cast<float>(r.get_number("label_smoothing", 0)),
                                                               reduction);
    if (name == "mse" || name == "mean_squared_error") return std::make_shared<losses::MeanSquaredError>(reduction);
    r.fail("name", "unknown loss '" + name + "' (expected sparse_categorical_crossentropy, categorical_crossentropy or mse)");
  });
}

}  // namespace dtrain
