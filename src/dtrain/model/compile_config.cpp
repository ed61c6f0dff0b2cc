// Optimizers, losses and learning-rate schedules from JSON (compile_config.h).
#include "dtrain/model/compile_config.h"

#include <charconv>
#include <cmath>
#include <exception>
#include <typeinfo>

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

// A float as the shortest decimal that reads back as the same float ("0.9", not
// 0.89999997615814209), unless that decimal would round differently on its way through
// a double: then the float's exact value.
json float_json(float f) {
  char text[32];
  const auto written = std::to_chars(text, text + sizeof text, f);
  double d = f;
  if (written.ec == std::errc() && std::from_chars(text, written.ptr, d).ec == std::errc() && static_cast<float>(d) == f)
    return d;
  return static_cast<double>(f);
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

namespace {

std::shared_ptr<optim::Optimizer> plain_optimizer_from_json(const json& value, const std::string& path) {
  const JsonReader r(value, path);
  if (value.is_string())
    return at_path(r, [&] { return std::shared_ptr<optim::Optimizer>(optim::get(value.get<std::string>())); });
  r.expect_object();
  const std::string name = r.get_string("name");
  if (name == "sgd")
    r.expect_keys({"name", "learning_rate", "momentum", "nesterov", "weight_decay", "clipnorm", "global_clipnorm"});
  else if (name == "rmsprop")
    r.expect_keys({"name", "learning_rate", "rho", "momentum", "epsilon", "centered", "weight_decay", "clipnorm",
                   "global_clipnorm"});
  else if (name == "adagrad")
    r.expect_keys({"name", "learning_rate", "initial_accumulator_value", "epsilon", "weight_decay", "clipnorm",
                   "global_clipnorm"});
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
      for (const char* key : {"momentum", "beta_1", "beta_2", "rho", "initial_accumulator_value", "epsilon",
                              "weight_decay", "global_clipnorm", "clipnorm"})
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
  if (name == "rmsprop" || name == "adagrad") o.weight_decay = static_cast<float>(r.get_number("weight_decay", 0.0));
  if (name == "rmsprop") {
    optim::RMSpropOptions p;
    p.rho = static_cast<float>(r.get_number("rho", p.rho));
    p.momentum = static_cast<float>(r.get_number("momentum", p.momentum));
    p.epsilon = static_cast<float>(r.get_number("epsilon", p.epsilon));
    p.centered = r.get_bool("centered", false);
    return at_key([&] { return std::make_shared<optim::RMSprop>(lr, p, o); });
  }
  if (name == "adagrad")
    return at_key([&] {
      return std::make_shared<optim::Adagrad>(lr, static_cast<float>(r.get_number("initial_accumulator_value", 0.1)),
                                              static_cast<float>(r.get_number("epsilon", 1e-7)), o);
    });
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
  r.fail("name", "unknown optimizer '" + name + "' (expected sgd, adam, adamw, rmsprop or adagrad)");
}

}  // namespace

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

json schedule_to_json(const optim::LearningRateSchedule& schedule) {
  using namespace optim;
  if (const auto* c = dynamic_cast<const Constant*>(&schedule)) return float_json(c->learning_rate());
  if (const auto* e = dynamic_cast<const ExponentialDecay*>(&schedule))
    return {{"class_name", "ExponentialDecay"},
            {"config",
             {{"initial_learning_rate", float_json(e->initial_learning_rate())},
              {"decay_steps", e->decay_steps()},
              {"decay_rate", float_json(e->decay_rate())},
              {"staircase", e->staircase()}}}};
  if (const auto* c = dynamic_cast<const CosineDecay*>(&schedule))
    return {{"class_name", "CosineDecay"},
            {"config",
             {{"initial_learning_rate", float_json(c->initial_learning_rate())},
              {"decay_steps", c->decay_steps()},
              {"alpha", float_json(c->alpha())}}}};
  if (const auto* p = dynamic_cast<const PiecewiseConstantDecay*>(&schedule)) {
    json values = json::array();
    for (float v : p->values()) values.push_back(float_json(v));
    return {{"class_name", "PiecewiseConstantDecay"}, {"config", {{"boundaries", p->boundaries()}, {"values", values}}}};
  }
  if (const auto* w = dynamic_cast<const LinearWarmup*>(&schedule))
    return {{"class_name", "LinearWarmup"},
            {"config",
             {{"warmup_steps", w->warmup_steps()},
              {"initial_learning_rate", float_json(w->initial_learning_rate())},
              {"after", schedule_to_json(w->after())}}}};
  DTRAIN_THROW(InvalidArgument, "the learning-rate schedule ", schedule.describe(),
               " has no JSON form (only Constant, ExponentialDecay, CosineDecay, PiecewiseConstantDecay and LinearWarmup)");
}

std::shared_ptr<optim::Optimizer> optimizer_from_json(const json& value, const std::string& path) {
  if (!value.is_object() || !value.contains("loss_scale")) return plain_optimizer_from_json(value, path);
  json plain = value;
  plain.erase("loss_scale");
  std::shared_ptr<optim::Optimizer> optimizer = plain_optimizer_from_json(plain, path);
  const JsonReader r = JsonReader(value, path).child("loss_scale");
  r.expect_object();
  r.expect_keys({"dynamic", "initial_scale", "dynamic_growth_steps"});
  optim::LossScale s;
  s.dynamic = r.get_bool("dynamic", s.dynamic);
  s.initial_scale = static_cast<float>(r.get_number("initial_scale", s.initial_scale));
  s.dynamic_growth_steps = r.get_int("dynamic_growth_steps", s.dynamic_growth_steps);
  try {
    optimizer->set_loss_scale(s);
  } catch (const InvalidArgument& e) {
    r.fail("", e.what());
  }
  return optimizer;
}

json optimizer_to_json(const optim::Optimizer& optimizer) {
  // The exact class: a subclass of Adam may update differently from Adam.
  const std::type_info& type = typeid(optimizer);
  json out;
  if (type == typeid(optim::SGD)) {
    const auto& sgd = static_cast<const optim::SGD&>(optimizer);
    out = {{"name", "sgd"}, {"momentum", float_json(sgd.momentum())}, {"nesterov", sgd.nesterov()}};
  } else if (type == typeid(optim::Adam) || type == typeid(optim::AdamW)) {
    const optim::AdamOptions& a = static_cast<const optim::Adam&>(optimizer).adam_options();
    out = {{"name", type == typeid(optim::Adam) ? "adam" : "adamw"},
           {"beta_1", float_json(a.beta_1)},
           {"beta_2", float_json(a.beta_2)},
           {"epsilon", float_json(a.epsilon)}};
  } else if (type == typeid(optim::RMSprop)) {
    const optim::RMSpropOptions& p = static_cast<const optim::RMSprop&>(optimizer).rmsprop_options();
    out = {{"name", "rmsprop"},
           {"rho", float_json(p.rho)},
           {"momentum", float_json(p.momentum)},
           {"epsilon", float_json(p.epsilon)},
           {"centered", p.centered}};
  } else if (type == typeid(optim::Adagrad)) {
    const auto& a = static_cast<const optim::Adagrad&>(optimizer);
    out = {{"name", "adagrad"},
           {"initial_accumulator_value", float_json(a.initial_accumulator_value())},
           {"epsilon", float_json(a.epsilon())}};
  } else {
    DTRAIN_THROW(InvalidArgument, "the optimizer '", optimizer.name(),
                 "' has no JSON form (only dtrain's own SGD, Adam, AdamW, RMSprop and Adagrad have one)");
  }
  out["learning_rate"] = schedule_to_json(optimizer.learning_rate_schedule());
  const optim::OptimizerOptions& o = optimizer.options();
  out["weight_decay"] = float_json(o.weight_decay);
  if (o.clipnorm) out["clipnorm"] = float_json(*o.clipnorm);
  if (o.global_clipnorm) out["global_clipnorm"] = float_json(*o.global_clipnorm);
  if (const auto& s = optimizer.loss_scale_options())
    out["loss_scale"] = {{"dynamic", s->dynamic},
                         {"initial_scale", float_json(s->initial_scale)},
                         {"dynamic_growth_steps", s->dynamic_growth_steps}};
  return out;
}

json loss_to_json(const losses::Loss& loss) {
  const std::type_info& type = typeid(loss);
  const std::string reduction = losses::reduction_name(loss.reduction());
  if (type == typeid(losses::SparseCategoricalCrossentropy))
    return {{"name", "sparse_categorical_crossentropy"},
            {"from_logits", static_cast<const losses::SparseCategoricalCrossentropy&>(loss).from_logits()},
            {"reduction", reduction}};
  if (type == typeid(losses::CategoricalCrossentropy)) {
    const auto& c = static_cast<const losses::CategoricalCrossentropy&>(loss);
    return {{"name", "categorical_crossentropy"},
            {"from_logits", c.from_logits()},
            {"label_smoothing", float_json(c.label_smoothing())},
            {"reduction", reduction}};
  }
  if (type == typeid(losses::MeanSquaredError)) return {{"name", "mean_squared_error"}, {"reduction", reduction}};
  DTRAIN_THROW(InvalidArgument, "the loss '", loss.name(),
               "' has no JSON form (only dtrain's own sparse_categorical_crossentropy, categorical_crossentropy and "
               "mean_squared_error have one)");
}

}  // namespace dtrain
