// The initial weights are a function of the seed alone: every strategy (default, one
// device, mirrored with one or two replicas, multi-worker with one worker, with or
// without TF_CONFIG) builds the same bits from the same set_random_seed. And
// MultiWorkerMirroredStrategy without TF_CONFIG (or with an empty one) is one local
// worker that trains at once, as the default strategy does. (Several worker processes
// are checked in multi_worker_test.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/storage_watch.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

// Layers without seeds of their own: they draw from set_random_seed's sequence.
std::unique_ptr<Sequential> unseeded_mlp() {
  auto model = std::make_unique<Sequential>();
  model->add<nn::Dense>(16, "relu");
  model->add<nn::Dense>(3, "softmax");
  model->compile("adam", "sparse_categorical_crossentropy", {});
  model->build(Shape{8});
  return model;
}

std::vector<std::vector<float>> weights_of(const Sequential& model) {
  std::vector<std::vector<float>> out;
  for (const Variable* v : model.variables()) out.push_back(v->value().to_vector());
  return out;
}

// The model built from seed 42 under `strategy` (none: no scope, the default strategy).
std::unique_ptr<Sequential> build_under(const std::function<std::unique_ptr<distribute::Strategy>()>& make) {
  set_random_seed(42);
  std::unique_ptr<distribute::Strategy> strategy = make ? make() : nullptr;
  std::optional<dtrain::detail::ScopedStrategy> scope;
  if (strategy) scope.emplace(strategy->scope());
  auto model = unseeded_mlp();
  return model;
}

// Sets TF_CONFIG (nullptr: unsets it) until destroyed, then restores it.
class ScopedTfConfig {
 public:
  explicit ScopedTfConfig(const char* value) {
    if (const char* old = std::getenv("TF_CONFIG")) old_ = old;
    if (value) setenv("TF_CONFIG", value, 1);
    else unsetenv("TF_CONFIG");
  }
  ~ScopedTfConfig() {
    if (old_) setenv("TF_CONFIG", old_->c_str(), 1);
    else unsetenv("TF_CONFIG");
  }

 private:
  std::optional<std::string> old_;
};

TEST(InitialWeights, AreTheSameBitsUnderEveryStrategy) {
  using distribute::MultiWorkerMirroredStrategy;
  const auto reference = weights_of(*build_under(nullptr));
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<distribute::Strategy>()>>> strategies = {
      {"DefaultStrategy", [] { return std::make_unique<distribute::DefaultStrategy>(); }},
      {"OneDeviceStrategy", [] { return std::make_unique<distribute::OneDeviceStrategy>(); }},
      {"MirroredStrategy(1)", [] { return std::make_unique<distribute::MirroredStrategy>(1); }},
      {"MirroredStrategy(2)", [] { return std::make_unique<distribute::MirroredStrategy>(2); }},
      {"MultiWorkerMirroredStrategy() without TF_CONFIG",
       [] {
         ScopedTfConfig none(nullptr);
         return std::make_unique<MultiWorkerMirroredStrategy>();
       }},
      {"MultiWorkerMirroredStrategy of one worker",
       [] {
         return std::make_unique<MultiWorkerMirroredStrategy>(cluster::parse_tf_config(
             R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})"));
       }},
      {"MultiWorkerMirroredStrategy of one worker, two replicas",
       [] {
         return std::make_unique<MultiWorkerMirroredStrategy>(
             cluster::parse_tf_config(R"({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief"}})"),
             distribute::CommunicationOptions{}, std::vector<std::string>{"/cpu:0", "/cpu:1"});
       }},
  };
  for (const auto& [name, make] : strategies) EXPECT_EQ(weights_of(*build_under(make)), reference) << name;
}

TEST(MultiWorkerMirroredStrategy, WithoutTfConfigIsOneLocalWorkerThatTrainsAtOnce) {
  data::Split d = data::make_synthetic(4 * 32, 8, 3, 5, data::SyntheticLabels::teacher);
  FitOptions fit;
  fit.batch_size = 32;
  fit.shuffle = false;
  fit.verbose = 0;
  auto reference = build_under(nullptr);
  reference->fit(d.x, d.y, fit);
  // Unset, blank and "{}" are the same: no cluster. Nothing listens on port 1 of
  // 127.0.0.1 (nor anywhere): none of them may try to meet anyone.
  for (const char* tf_config : {static_cast<const char*>(nullptr), "", "  ", "{}", " { } "}) {
    ScopedTfConfig env(tf_config);
    const std::string which = tf_config ? "TF_CONFIG='" + std::string(tf_config) + "'" : "no TF_CONFIG";
    std::unique_ptr<distribute::MultiWorkerMirroredStrategy> strategy;
    std::unique_ptr<Sequential> model = build_under([&]() -> std::unique_ptr<distribute::Strategy> {
      auto s = std::make_unique<distribute::MultiWorkerMirroredStrategy>();
      EXPECT_EQ(s->num_workers(), 1) << which;
      EXPECT_EQ(s->worker_index(), 0) << which;
      EXPECT_TRUE(s->is_chief()) << which;
      EXPECT_EQ(s->num_replicas_in_sync(), 1) << which;
      return s;
    });
    model->fit(d.x, d.y, fit);
    EXPECT_EQ(model->optimizer().iterations(), 4) << which;
    EXPECT_EQ(weights_of(*model), weights_of(*reference)) << which;
  }
}

// Two replicas update the variables they share in shares, one thread each: nothing holds
// a variable's storage then, so each update writes in place and copies no variable.
TEST(MirroredStrategy, FitUpdatesTheVariablesInPlace) {
  data::Split d = data::make_synthetic(4 * 32, 8, 3, 5, data::SyntheticLabels::teacher);
  auto model = build_under([] { return std::make_unique<distribute::MirroredStrategy>(2); });
  FitOptions fit;
  fit.batch_size = 32;
  fit.verbose = 0;
  model->fit(d.x, d.y, fit);
  const auto before = weights_of(*model);
  auto watch = std::make_shared<testing::StorageWatch>();
  fit.callbacks = {watch};
  model->fit(d.x, d.y, fit);
  EXPECT_NE(weights_of(*model), before);
  EXPECT_EQ(watch->batches, 4);
  EXPECT_EQ(watch->moves, 0);
}

}  // namespace
}  // namespace dtrain
