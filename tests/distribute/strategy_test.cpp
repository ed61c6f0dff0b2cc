// MirroredStrategy gives one device's answer; failures name their replica; misuse is an
// error. The models are the seeds' large MLP (1024-1024-1024-10) and smaller ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "common/compare.h"
#include "common/masked_encoder.h"
#include "common/quiet_fit.h"
#include "common/tiny_transformer.h"
#include "common/two_headed.h"
#include "dtrain/core/replica.h"
#include "dtrain/distribute/bucket_reducer.h"
#include "dtrain/distribute/device_reducer.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

using distribute::MirroredStrategy;
using distribute::PerReplica;
using distribute::ReduceOp;

// The seeds' large MLP with fixed seeds: the same initial weights every time.
std::unique_ptr<Sequential> large_mlp(std::int64_t features = 1024, std::int64_t hidden = 1024) {
  auto model = std::make_unique<Sequential>();
  model->add<nn::Dense>(hidden, "relu", nn::DenseOptions{.seed = 1});
  model->add<nn::Dense>(hidden, "relu", nn::DenseOptions{.seed = 2});
  model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 3});
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  model->build(Shape{features});
  return model;
}

using testing::quiet;
using testing::relative_difference;

TEST(MirroredStrategy, FitMatchesOneDeviceWithOneTwoAndFourReplicas) {
  // 20 steps of a global batch of 64.
  data::Split d = data::make_synthetic(20 * 64, 1024, 10, 7, data::SyntheticLabels::teacher);
  auto reference = large_mlp();
  reference->fit(d.x, d.y, quiet(64));
  // How far float rounding alone moves the weights: the same one-device run on one thread.
  // oneDNN's AVX2 kernels split their sums by the thread count, which after 20 Adam steps
  // moves these weights by about 7e-5; a replica's missing or doubled share moves them by
  // orders of magnitude more.
  auto one_thread = large_mlp();
  {
    ScopedThreads threads(1);
    one_thread->fit(d.x, d.y, quiet(64));
  }
  const double rounding = relative_difference(*one_thread, *reference);
  RecordProperty("rounding", std::to_string(rounding));
  const double tolerance = std::max(1e-5, 4 * rounding);
  for (int replicas : {1, 2, 4}) {
    MirroredStrategy strategy(replicas);
    std::unique_ptr<Sequential> model;
    {
      auto scope = strategy.scope();
      model = large_mlp();
    }
    ASSERT_EQ(model->distribute_strategy()->num_replicas(), replicas);
    model->fit(d.x, d.y, quiet(64));
    const double diff = relative_difference(*model, *reference);
    EXPECT_LE(diff, tolerance) << replicas << " replicas (rounding alone: " << rounding << ")";
    RecordProperty("relative_difference_" + std::to_string(replicas), std::to_string(diff));
    EXPECT_EQ(model->optimizer().iterations(), 20);
  }
}

TEST(MirroredStrategy, AccumulatedMicroBatchesMatchOneLargeBatch) {
  data::Split d = data::make_synthetic(2 * 64, 48, 10, 3, data::SyntheticLabels::teacher);
  // Two updates from batches of 64 ...
  auto reference = large_mlp(48, 32);
  reference->fit(d.x, d.y, quiet(64));
  // ... equal two updates from 4 micro-batches of 16, on one device and on 2 replicas.
  for (int replicas : {1, 2}) {
    MirroredStrategy strategy(replicas);
    std::unique_ptr<Sequential> model;
    {
      auto scope = strategy.scope();
      model = large_mlp(48, 32);
    }
    FitOptions o = quiet(16);
    o.gradient_accumulation_steps = 4;
    model->fit(d.x, d.y, o);
    EXPECT_EQ(model->optimizer().iterations(), 2) << replicas << " replicas";
    EXPECT_LE(relative_difference(*model, *reference), 1e-5) << replicas << " replicas";
  }
  // Without any strategy too.
  auto plain = large_mlp(48, 32);
  FitOptions o = quiet(16);
  o.gradient_accumulation_steps = 4;
  plain->fit(d.x, d.y, o);
  EXPECT_LE(relative_difference(*plain, *reference), 1e-5);
}

TEST(MirroredStrategy, ShortLastBatchesAndOddSplitsMatchOneDevice) {
  // Global batch 48 over 3 replicas, 16/16/16. 100 rows: a last batch of 4, split 2/1/1.
  // 50 rows: a last batch of 2, which leaves the third replica none (it still computes
  // its share of the dense layers' gradients). Under mixed_bfloat16 too, where dense
  // multiplies bfloat16 copies and each replica computes its own weight gradients, which
  // the replicas then sum: each product of bfloat16 values is exact in float32, so only
  // the order of the float32 sums differs from one device's.
  for (const char* policy : {"float32", "mixed_bfloat16"}) {
    const nn::ScopedGlobalPolicy scoped(policy);
    for (const std::int64_t rows : {100, 50}) {
      data::Split d = data::make_synthetic(rows, 20, 10, 5, data::SyntheticLabels::teacher);
      auto reference = large_mlp(20, 16);
      reference->fit(d.x, d.y, quiet(48, 2));
      MirroredStrategy strategy(3);
      std::unique_ptr<Sequential> model;
      {
        auto scope = strategy.scope();
        model = large_mlp(20, 16);
      }
      History h = model->fit(d.x, d.y, quiet(48, 2));
      EXPECT_LE(relative_difference(*model, *reference), 1e-5) << rows << " rows, " << policy;
      EXPECT_EQ(model->optimizer().iterations(), rows / 48 * 2 + 2) << rows << " rows, " << policy;
      ASSERT_EQ(h.history.at("loss").size(), 2u);
    }
  }
}

TEST(MirroredStrategy, AccumulationOverAShortLastBatchAndADenseWithoutBiasMatchOneDevice) {
  // Batches of 16, 16, 16 and 2 in groups of two: the last micro-batch leaves the third
  // replica no rows while the group's gradients accumulate; the first layer has no bias.
  data::Split d = data::make_synthetic(50, 12, 10, 9, data::SyntheticLabels::teacher);
  auto model_of = [] {
    auto m = std::make_unique<Sequential>();
    m->add<nn::Dense>(16, "relu", nn::DenseOptions{.use_bias = false, .seed = 1});
    m->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2});
    m->compile("adam", "sparse_categorical_crossentropy");
    m->build(Shape{12});
    return m;
  };
  FitOptions o = quiet(16);
  o.gradient_accumulation_steps = 2;
  auto reference = model_of();
  reference->fit(d.x, d.y, o);
  MirroredStrategy strategy(3);
  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = model_of();
  }
  model->fit(d.x, d.y, o);
  EXPECT_EQ(model->optimizer().iterations(), 2);
  EXPECT_LE(relative_difference(*model, *reference), 1e-5);
}

// Regularization penalties join the loss once per global batch, whatever the replicas and
// however the last batch splits (2/1/1, and 1/1/0 which leaves a replica none): weight
// penalties whole, the activity penalty as one mean over the global batch. For a mean loss
// and for a summed one; evaluate reports the loss with the penalties, as Keras does.
TEST(MirroredStrategy, RegularizedFitMatchesOneDevice) {
  auto model_of = [](losses::Reduction reduction) {
    auto m = std::make_unique<Sequential>();
    m->add<nn::Dense>(16, "relu",
                      nn::DenseOptions{.seed = 1, .kernel_regularizer = nn::Regularizer::L1L2(1e-3f, 1e-2f),
                                       .bias_regularizer = nn::Regularizer::L2(0.05f),
                                       .kernel_constraint = Constraint::max_norm(1.0f)});
    m->layers().back()->set_activity_regularizer(nn::Regularizer::L1(1e-2f));
    m->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2, .kernel_regularizer = nn::Regularizer::L2(0.1f)});
    m->compile(optim::get("adam"), std::make_shared<losses::SparseCategoricalCrossentropy>(false, reduction));
    m->build(Shape{12});
    return m;
  };
  for (const losses::Reduction reduction : {losses::Reduction::sum_over_batch_size, losses::Reduction::sum}) {
    for (const std::int64_t rows : {100, 50}) {
      const data::Split d = data::make_synthetic(rows, 12, 10, 5, data::SyntheticLabels::teacher);
      auto reference = model_of(reduction);
      const History expected = reference->fit(d.x, d.y, quiet(48, 2));
      MirroredStrategy strategy(3);
      std::unique_ptr<Sequential> model;
      {
        auto scope = strategy.scope();
        model = model_of(reduction);
      }
      const History h = model->fit(d.x, d.y, quiet(48, 2));
      const char* which = reduction == losses::Reduction::sum ? "sum" : "mean";
      EXPECT_LE(relative_difference(*model, *reference), 1e-5) << rows << " rows, " << which;
      EXPECT_NEAR(h.history.at("loss").back(), expected.history.at("loss").back(),
                  1e-5 * std::abs(expected.history.at("loss").back()))
          << rows << " rows, " << which;
    }
  }
  // evaluate: the loss plus the penalties (the activity one of the evaluated batch).
  const data::Split d = data::make_synthetic(32, 12, 10, 6, data::SyntheticLabels::teacher);
  auto model = model_of(losses::Reduction::sum_over_batch_size);
  const double with = model->evaluate(d.x, d.y, {.batch_size = 32, .verbose = 0}).at("loss");
  double penalties = 0;
  for (const Tensor& t : model->losses()) penalties += t.item();
  const double plain = model->loss()(d.y, (*model)(d.x)).item();
  EXPECT_GT(penalties, 0.01);
  EXPECT_NEAR(with, plain + penalties, 1e-5 * with);
}

// A model of two inputs and two outputs: each replica takes its rows of every input and
// target, and the weighted sum of the outputs' losses (and each output's own, logged) comes
// out as one device's, for a mean loss and a summed one, over an odd split (17 rows: 6/6/5).
TEST(MirroredStrategy, SeveralInputsAndOutputsMatchOneDevice) {
  for (const losses::Reduction reduction : {losses::Reduction::sum_over_batch_size, losses::Reduction::sum}) {
    auto compiled = [&](std::unique_ptr<Model> m) {
      m->compile(std::make_shared<optim::SGD>(0.05f),
                 {std::make_shared<losses::SparseCategoricalCrossentropy>(true, reduction),
                  std::make_shared<losses::MeanSquaredError>(reduction)},
                 {{"accuracy"}, {}}, {1.0, 0.5});
      return m;
    };
    const TensorData d = testing::two_headed_data(51);
    auto reference = compiled(testing::two_headed());
    const History expected = reference->fit(d, quiet(17, 2));
    MirroredStrategy strategy(3);
    std::unique_ptr<Model> model;
    {
      auto scope = strategy.scope();
      model = compiled(testing::two_headed());
    }
    const History h = model->fit(d, quiet(17, 2));
    const char* which = reduction == losses::Reduction::sum ? "sum" : "mean";
    EXPECT_LE(relative_difference(*model, *reference), 1e-5) << which;
    for (const char* key : {"loss", "kind_loss", "size_loss", "kind_accuracy"})
      EXPECT_NEAR(h.history.at(key).back(), expected.history.at(key).back(),
                  1e-5 * std::max(1.0, std::abs(expected.history.at(key).back())))
          << key << ", " << which;
  }
}

// A transformer (embedding, learned positions, causal multi-head attention with dropout of
// its weights, layer norms, GELU): replicas give one device's weights without dropout;
// with it, each replica draws its own masks (the weights then differ, and stay finite).
TEST(MirroredStrategy, ATransformerMatchesOneDevice) {
  const testing::TokenData d = testing::ordered_pairs(96);
  auto compiled = [](std::unique_ptr<Model> m) {
    m->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true),
               {"accuracy"});
    return m;
  };
  auto reference = compiled(testing::tiny_transformer(12, 16, /*causal=*/true));
  reference->fit(d.ids, d.labels, quiet(32, 2));
  MirroredStrategy strategy(2);
  std::unique_ptr<Model> model, dropped;
  {
    auto scope = strategy.scope();
    model = compiled(testing::tiny_transformer(12, 16, /*causal=*/true));
    dropped = compiled(testing::tiny_transformer(12, 16, /*causal=*/true, /*dropout=*/0.2f));
  }
  model->fit(d.ids, d.labels, quiet(32, 2));
  // Per value, not relative. The keys' bias has no gradient (a shift of all of a query's
  // scores leaves its softmax as it is): its gradient is rounding's alone, which Adam
  // scales up to steps of about 1e-5 that differ between the two runs (with FMA's
  // rounding, 1.1e-5 apart): it is checked to stay near 0 in both instead.
  const auto is_keys_bias = [](const Variable& v) { return v.name().ends_with("/key/bias"); };
  auto largest_difference = [&](const Model& a, const Model& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.variables().size(); ++i) {
      if (is_keys_bias(*a.variables()[i])) continue;
      const std::vector<float> x = a.variables()[i]->value().to_vector(), y = b.variables()[i]->value().to_vector();
      for (std::size_t j = 0; j < x.size(); ++j) worst = std::max(worst, double(std::abs(x[j] - y[j])));
    }
    return worst;
  };
  ASSERT_EQ(model->variables().size(), reference->variables().size());
  EXPECT_LE(largest_difference(*model, *reference), 1e-5);
  for (const Model* m : {model.get(), reference.get()}) {
    int found = 0;
    for (const Variable* v : m->variables())
      if (is_keys_bias(*v) && ++found) {
        for (float x : v->value().to_vector()) EXPECT_LT(std::abs(x), 1e-3f) << v->name();
      }
    ASSERT_EQ(found, 1) << "the keys' bias is named otherwise: the test would leave out nothing";
  }
  const History h = dropped->fit(d.ids, d.labels, quiet(32, 2));
  EXPECT_TRUE(std::isfinite(h.history.at("loss").back()));
  EXPECT_GT(largest_difference(*dropped, *reference), 1e-3) << "dropout changed nothing";
}

TEST(MirroredStrategy, FitOnADatasetMatchesFitOnTensors) {
  data::Split d = data::make_synthetic(96, 12, 10, 8, data::SyntheticLabels::teacher);
  MirroredStrategy strategy(2);
  std::unique_ptr<Sequential> on_tensors, on_dataset;
  {
    auto scope = strategy.scope();
    on_tensors = large_mlp(12, 8);
    on_dataset = large_mlp(12, 8);
  }
  on_tensors->fit(d.x, d.y, quiet(32, 2));
  on_dataset->fit(data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).prefetch(data::AUTOTUNE), quiet(32, 2));
  EXPECT_EQ(relative_difference(*on_dataset, *on_tensors), 0.0);
}

// The seeds' custom loop (003 example 3): the step, optimizer included, runs in
// strategy.run; apply_gradients in a replica sums the replicas' gradients.
TEST(MirroredStrategy, CustomLoopWithRunMatchesOneDevice) {
  data::Split d = data::make_synthetic(8 * 32, 24, 10, 9, data::SyntheticLabels::teacher);
  const std::int64_t global_batch = 32;
  auto train = [&](distribute::Strategy* strategy) {
    std::unique_ptr<Sequential> model;
    std::unique_ptr<optim::Adam> optimizer;
    {
      std::optional<dtrain::detail::ScopedStrategy> scope;
      if (strategy) scope.emplace(strategy->scope());
      model = large_mlp(24, 16);
      optimizer = std::make_unique<optim::Adam>(0.01f);
    }
    losses::SparseCategoricalCrossentropy loss_fn(false, losses::Reduction::none);
    auto vars = model->trainable_variables();
    auto step = [&](const data::Element& batch) {
      GradientTape tape;
      Tensor per_example = loss_fn(batch[1], (*model)(batch[0], true));
      Tensor loss = distribute::compute_average_loss(per_example, global_batch);
      optimizer->apply_gradients(tape.gradient(loss, vars), vars);
      return loss;
    };
    data::Dataset ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(global_batch);
    if (!strategy) {
      for (data::Iterator it = ds.make_iterator(); auto b = it.next();) step(*b);
    } else {
      for (const auto& batch : strategy->experimental_distribute_dataset(ds)) {
        PerReplica<Tensor> losses = strategy->run(step, batch);
        const float total = strategy->reduce(ReduceOp::SUM, losses).item();
        EXPECT_TRUE(std::isfinite(total));
      }
    }
    return model;
  };
  auto reference = train(nullptr);
  MirroredStrategy strategy(2);
  auto mirrored = train(&strategy);
  EXPECT_LE(relative_difference(*mirrored, *reference), 1e-5);
}

// The seeds' accumulation (001 example 3) with the no_sync helper: replicas keep their
// own sums and reduce once per K micro-batches.
TEST(MirroredStrategy, GradientAccumulatorMatchesOneLargeBatch) {
  data::Split d = data::make_synthetic(64, 24, 10, 4, data::SyntheticLabels::teacher);
  losses::SparseCategoricalCrossentropy loss_fn(false, losses::Reduction::none);
  // One update from the whole 64 rows on one device.
  auto reference = large_mlp(24, 16);
  {
    auto vars = reference->trainable_variables();
    GradientTape tape;
    Tensor loss = distribute::compute_average_loss(loss_fn(d.y, (*reference)(d.x, true)), 64);
    reference->optimizer().apply_gradients(tape.gradient(loss, vars), vars);
  }
  MirroredStrategy strategy(2);
  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = large_mlp(24, 16);
  }
  auto vars = model->trainable_variables();
  distribute::GradientAccumulator accumulator(strategy, 4);
  // One worker: the dataset's sharding policy does not apply (FILE over tensors included).
  data::DatasetOptions file;
  file.auto_shard_policy = data::AutoShardPolicy::FILE;
  data::Dataset ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(16).with_options(file);
  int updates = 0;
  for (const auto& batch : strategy.experimental_distribute_dataset(ds)) {
    strategy.run(
        [&](const data::Element& b) {
          GradientTape tape;
          Tensor loss = distribute::compute_average_loss(loss_fn(b[1], (*model)(b[0], true)), 16);
          accumulator.accumulate(tape.gradient(loss, vars));
        },
        batch);
    if (accumulator.ready()) {
      model->optimizer().apply_gradients(accumulator.reduce(ReduceOp::SUM), vars);
      ++updates;
    }
  }
  EXPECT_EQ(updates, 1);
  EXPECT_LE(relative_difference(*model, *reference), 1e-5);
}

// A layer that fails on one replica, to check that failures stop everything cleanly.
class FailOnReplica : public nn::Layer {
 public:
  explicit FailOnReplica(int replica) : Layer("fail_on_replica"), replica_(replica) {}
  Shape compute_output_shape(const Shape& s) const override { return s; }
  std::string class_name() const override { return "FailOnReplica"; }

 protected:
  Tensor call(const Tensor& x, bool) override {
    if (replica_context().replica_id == replica_) DTRAIN_THROW(InvalidArgument, "planted failure");
    return x;
  }

 private:
  int replica_;
};

// Reads another layer's kernel as well (a tied weight): its gradient then has two parts.
class ReadsKernel : public nn::Layer {
 public:
  explicit ReadsKernel(nn::Dense& tied) : Layer("reads_kernel"), tied_(tied) {}
  Shape compute_output_shape(const Shape& s) const override { return s; }
  std::string class_name() const override { return "ReadsKernel"; }

 protected:
  Tensor call(const Tensor& x, bool) override { return add(x, affine(reduce_sum(tied_.kernel().value()), 0.0f)); }

 private:
  nn::Dense& tied_;
};

TEST(MirroredStrategy, AFailingReplicaIsNamedAndNothingHangs) {
  MirroredStrategy strategy(2);
  data::Split d = data::make_synthetic(64, 8, 10, 1, data::SyntheticLabels::teacher);
  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = std::make_unique<Sequential>();
    model->add<nn::Dense>(8, "relu");
    model->add<FailOnReplica>(1);
    model->add<nn::Dense>(10, "softmax");
    model->compile("adam", "sparse_categorical_crossentropy");
  }
  try {
    model->fit(d.x, d.y, quiet(32));
    ADD_FAILURE() << "fit did not fail";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MirroredStrategy replica 1 (/cpu:1)"), std::string::npos) << what;
    EXPECT_NE(what.find("planted failure"), std::string::npos) << what;
  }
  // A custom loop: replica 0 waits in apply_gradients' all-reduce for replica 1, which fails.
  auto vars = model->trainable_variables();
  // The cross-replica call every replica must make.
  auto apply_zero_gradients = [&] {
    std::vector<Tensor> grads;
    for (Variable* v : vars) grads.push_back(Tensor::zeros(v->shape()));
    model->optimizer().apply_gradients(grads, vars);
  };
  try {
    strategy.run([&] {
      if (replica_context().replica_id == 1) DTRAIN_THROW(IoError, "replica one's input broke");
      apply_zero_gradients();
    });
    ADD_FAILURE() << "run did not fail";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 (/cpu:1): replica one's input broke"), std::string::npos) << e.what();
  }
  // A replica that returns without the cross-replica call the others make releases them.
  try {
    strategy.run([&] {
      if (replica_context().replica_id == 1) return;  // e.g. it got an empty batch
      apply_zero_gradients();
    });
    ADD_FAILURE() << "run did not fail";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 returned without joining"), std::string::npos) << e.what();
  }
  // The strategy still works afterwards.
  PerReplica<Tensor> ids = strategy.run([] { return Tensor::scalar(static_cast<float>(replica_context().replica_id)); });
  EXPECT_FLOAT_EQ(strategy.reduce(ReduceOp::SUM, ids).item(), 1.0f);
}

// A replica stuck in user code does not hang its siblings: the one waiting for it at a
// cross-replica call fails with Timeout naming it and the call. (The test lets the stuck
// replica go only after checking the error: run() returns once every replica has.)
TEST(MirroredStrategy, AReplicaStuckInUserCodeIsATimeoutNamingIt) {
  MirroredStrategy strategy(2, {.timeout_seconds = 0.1});
  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = std::make_unique<Sequential>();
    model->add<nn::Dense>(4);
    model->compile("sgd", "mse");
    model->build(Shape{3});
  }
  auto vars = model->trainable_variables();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::string seen_by_replica_0;
  try {
    strategy.run([&] {
      if (replica_context().replica_id == 1) released.wait();  // stuck, as in a user's code
      std::vector<Tensor> grads;
      for (Variable* v : vars) grads.push_back(Tensor::zeros(v->shape()));
      try {
        model->optimizer().apply_gradients(grads, vars);
      } catch (const Timeout& e) {
        seen_by_replica_0 = e.what();
        release.set_value();
        throw;
      }
    });
    ADD_FAILURE() << "run did not fail";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MirroredStrategy replica 0 (/cpu:0): all_reduce: replica 0 waited 0.1 s, and replica(s) 1 "
                        "(/cpu:1) never arrived"),
              std::string::npos)
        << what;
  }
  EXPECT_NE(seen_by_replica_0.find("replica(s) 1 (/cpu:1) never arrived"), std::string::npos) << seen_by_replica_0;
  // The strategy still works afterwards.
  PerReplica<Tensor> ids = strategy.run([] { return Tensor::scalar(static_cast<float>(replica_context().replica_id)); });
  EXPECT_FLOAT_EQ(strategy.reduce(ReduceOp::SUM, ids).item(), 1.0f);
}

// merge_call: the others wait for replica 0's merged function twice the timeout, with a
// message of their own, and an error of the function's own is what run() throws, also
// when the others gave up waiting first (the function goes on only once one of them has
// caught its Timeout; the bounds on the test's own waits only keep it from hanging).
TEST(MirroredStrategy, AMergedFunctionsOwnErrorWinsOverTheOthersTimeouts) {
  MirroredStrategy strategy(3, {.timeout_seconds = 0.1});
  auto merged = [](const std::function<void()>& fn) { replica_context().cross->merge_call(fn); };
  // The function fails at once: the others are released, and run() throws its error.
  try {
    strategy.run([&] { merged([] { DTRAIN_THROW(IoError, "the merged function broke"); }); });
    ADD_FAILURE() << "run did not fail";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("replica 0 (/cpu:0): the merged function broke"), std::string::npos) << e.what();
  }
  // The function outlasts the others' patience, then fails.
  std::promise<std::string> gave_up;
  std::shared_future<std::string> seen = gave_up.get_future().share();
  std::once_flag once;
  try {
    strategy.run([&] {
      try {
        merged([&] {
          if (seen.wait_for(std::chrono::seconds(60)) != std::future_status::ready) ADD_FAILURE() << "nobody gave up";
          DTRAIN_THROW(IoError, "the slow merged function broke");
        });
      } catch (const Timeout& e) {
        std::call_once(once, [&] { gave_up.set_value(e.what()); });
        throw;
      }
    });
    ADD_FAILURE() << "run did not fail";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("replica 0 (/cpu:0): the slow merged function broke"), std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "run threw another error than the merged function's: " << e.what();
  }
  ASSERT_EQ(seen.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_NE(seen.get().find("merge_call (waiting for replica 0's merged function): replica "), std::string::npos)
      << seen.get();
  EXPECT_NE(seen.get().find(" waited 0.2 s, and replica 0 (/cpu:0) had not finished"), std::string::npos) << seen.get();
  // The strategy still works afterwards.
  PerReplica<Tensor> ids = strategy.run([] { return Tensor::scalar(static_cast<float>(replica_context().replica_id)); });
  EXPECT_FLOAT_EQ(strategy.reduce(ReduceOp::SUM, ids).item(), 3.0f);
}

// A run that failed at a barrier leaves no replica marked as arrived for the next run: a
// later timeout names exactly the replica stuck then.
TEST(MirroredStrategy, ATimeoutNamesTheReplicaStuckInThisRunNotInTheLast) {
  MirroredStrategy strategy(3, {.timeout_seconds = 0.1});
  auto run_with_stuck = [&](int stuck) {
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::once_flag once;
    try {
      strategy.run([&] {
        const int me = replica_context().replica_id;
        if (me == stuck) {
          if (released.wait_for(std::chrono::seconds(60)) != std::future_status::ready) ADD_FAILURE() << "never released";
          return;
        }
        try {
          const std::vector<Tensor> one{Tensor::scalar(1.0f)};
          replica_context().cross->all_reduce_sum(one);
        } catch (const Timeout&) {
          std::call_once(once, [&] { release.set_value(); });
          throw;
        }
      });
    } catch (const Timeout& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("not a Timeout: ") + e.what();
    }
    return std::string("no error");
  };
  const std::string first = run_with_stuck(2);
  EXPECT_NE(first.find("and replica(s) 2 (/cpu:2) never arrived"), std::string::npos) << first;
  const std::string second = run_with_stuck(1);
  EXPECT_NE(second.find("and replica(s) 1 (/cpu:1) never arrived"), std::string::npos) << second;
}

// fit()'s waits, one by one: the gradient buckets' all-reduce, the dense layers' barrier
// and the step's barrier each name the replica that never came.
TEST(MirroredStrategy, FitsWaitsForAMissingReplicaEndInTimeouts) {
  Variable kernel("kernel", Tensor::zeros({3, 2})), bias("bias", Tensor::zeros({2})), other("other", Tensor::zeros({5}));
  const std::vector<Variable*> vars{&kernel, &bias, &other};
  const std::chrono::milliseconds timeout(100);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Timeout& e) {
      return std::string(e.what());
    }
    return std::string("no timeout");
  };
  {
    // Every variable in buckets: replica 0 hands them all over, replica 1 none.
    distribute::detail::BucketReducer reducer(2, vars, 0, {}, {}, timeout);
    const std::vector<std::int64_t> rows{0, 1, 2};
    reducer.begin_step(true, rows);
    for (std::size_t i = 0; i < vars.size(); ++i) reducer.gradient_ready(0, i, Tensor::full(vars[i]->shape(), 1.0f));
    const std::string what = message([&] { reducer.finish(0); });
    EXPECT_NE(what.find("all-reduce of gradient bucket 0 (of 1): replica 0 waited 0.1 s, and replica(s) 1 never arrived"),
              std::string::npos)
        << what;
  }
  const std::vector<DenseVariables> dense{{0, 1}};
  {
    // The dense layer computed together: replica 0 comes to the layer, replica 1 not.
    distribute::detail::BucketReducer reducer(2, vars, 0, {}, dense, timeout);
    const std::vector<std::int64_t> rows{0, 1, 2};
    reducer.begin_step(true, rows);
    Tensor dw, db;
    const std::string what = message([&] {
      reducer.dense_gradients_together(0)->gradients(kernel.value(), Tensor::full({1, 3}, 1.0f), Tensor::full({1, 2}, 1.0f), dw, db);
    });
    EXPECT_NE(what.find("the gradients of 'kernel': dense layer barrier: replica 0 waited 0.1 s, and replica(s) 1 "
                        "never arrived"),
              std::string::npos)
        << what;
  }
  {
    // Replica 0 is done with backward (it had no rows); replica 1 never finishes.
    distribute::detail::BucketReducer reducer(2, vars, 0, {}, dense, timeout);
    const std::vector<std::int64_t> rows{0, 0, 2};
    reducer.begin_step(true, rows);
    for (std::size_t i = 0; i < vars.size(); ++i) reducer.gradient_ready(0, i, Tensor());
    const std::string what = message([&] { reducer.finish(0); });
    EXPECT_NE(what.find("step barrier (the end of backward): replica 0 waited 0.1 s, and replica(s) 1 never arrived"),
              std::string::npos)
        << what;
  }
}

TEST(MirroredStrategy, MisuseIsAClearError) {
  MirroredStrategy strategy(2);
  // A variable made outside the scope, used inside run.
  auto outside = large_mlp(8, 4);
  try {
    strategy.run([&] { (*outside)(Tensor::zeros(Shape{2, 8})); });
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("variable 'dense/kernel' was created outside the scope"), std::string::npos)
        << e.what();
  }
  // A global batch smaller than the replicas.
  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = large_mlp(8, 4);
  }
  data::Split d = data::make_synthetic(8, 8, 10, 1, data::SyntheticLabels::teacher);
  try {
    model->fit(d.x, d.y, quiet(1));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than the 2 replicas"), std::string::npos) << e.what();
  }
  // A dense layer's kernel that another layer reads too.
  std::unique_ptr<Sequential> tied;
  {
    auto scope = strategy.scope();
    tied = std::make_unique<Sequential>();
    auto first = std::make_shared<nn::Dense>(8, "relu", nn::DenseOptions{.name = "first"});
    tied->add(first);
    tied->add(std::make_shared<ReadsKernel>(*first));
    tied->add<nn::Dense>(10, "softmax");
    tied->compile("adam", "sparse_categorical_crossentropy");
  }
  try {
    tied->fit(d.x, d.y, quiet(4));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("first/kernel is also read outside its dense layer"), std::string::npos)
        << e.what();
  }
  auto tiny = strategy.experimental_distribute_dataset(data::Dataset::from_tensor_slices({d.x, d.y}).batch(1));
  EXPECT_THROW(tiny.make_iterator().next(), InvalidArgument);
  // reduce of a value that is not per-replica.
  try {
    strategy.reduce(ReduceOp::SUM, Tensor::scalar(1.0f));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not a per-replica value"), std::string::npos) << e.what();
  }
  // A per-replica argument of the wrong width.
  EXPECT_THROW(strategy.run([](const Tensor&) {}, PerReplica<Tensor>({Tensor::scalar(1.0f)})), InvalidArgument);
  // Devices.
  if (device_count(DeviceType::cuda) == 0) {  // a GPU that is not here
    EXPECT_THROW(MirroredStrategy(std::vector<std::string>{"/gpu:0"}), InvalidArgument);
  }
  EXPECT_THROW(MirroredStrategy(std::vector<std::string>{"/cpu:0", "/gpu:0"}), InvalidArgument);
  EXPECT_THROW(MirroredStrategy(std::vector<std::string>{"/cpu:0", "cpu:0"}), InvalidArgument);
  EXPECT_THROW(MirroredStrategy(std::vector<std::string>{"/tpu:0"}), InvalidArgument);
  EXPECT_THROW(MirroredStrategy(0), InvalidArgument);
  EXPECT_EQ(MirroredStrategy(std::vector<std::string>{"/job:localhost/replica:0/task:0/device:CPU:1", "/device:CPU:0"})
                .devices(),
            (std::vector<std::string>{"/cpu:1", "/cpu:0"}));
}

TEST(MirroredStrategy, ReduceGatherAndDistributedBatches) {
  MirroredStrategy strategy(2);
  // Dataset of 7 rows in global batches of 4: replicas get 2+2, then 2+1 (TensorFlow's example).
  data::Dataset ds = data::Dataset::from_tensor_slices({Tensor::from_vector(Shape{7}, {0, 1, 2, 3, 4, 5, 6})}).batch(4);
  std::vector<std::vector<std::vector<float>>> seen;
  for (const auto& batch : strategy.experimental_distribute_dataset(ds)) {
    seen.push_back({batch[0][0].to_vector(), batch[1][0].to_vector()});
    PerReplica<Tensor> doubled = strategy.run([](const data::Element& b) { return b[0] * 2.0f; }, batch);
    EXPECT_EQ(strategy.gather(doubled).to_vector().size(), batch[0][0].numel() + batch[1][0].numel());
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], (std::vector<std::vector<float>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(seen[1], (std::vector<std::vector<float>>{{4, 5}, {6}}));

  PerReplica<Tensor> v({Tensor::from_vector(Shape{2, 2}, {1, 2, 3, 4}), Tensor::from_vector(Shape{2, 2}, {10, 20, 30, 40})});
  EXPECT_EQ(strategy.reduce(ReduceOp::SUM, v).to_vector(), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(strategy.reduce(ReduceOp::MEAN, v).to_vector(), (std::vector<float>{5.5f, 11, 16.5f, 22}));
  EXPECT_EQ(strategy.reduce(ReduceOp::SUM, v, 0).to_vector(), (std::vector<float>{44, 66}));
  EXPECT_EQ(strategy.reduce(ReduceOp::MEAN, v, 0).to_vector(), (std::vector<float>{11, 16.5f}));
  EXPECT_EQ(strategy.gather(v).to_vector(), (std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40}));
  PerReplica<Tensor> mismatched({Tensor::zeros(Shape{2}), Tensor::zeros(Shape{3})});
  EXPECT_THROW(strategy.reduce(ReduceOp::SUM, mismatched), InvalidArgument);
}

TEST(MirroredStrategy, DropoutMasksDifferPerReplicaAndRepeatWithTheSeed) {
  auto masks = [] {
    MirroredStrategy strategy(2);
    std::unique_ptr<nn::Dropout> dropout;
    {
      auto scope = strategy.scope();
      dropout = std::make_unique<nn::Dropout>(0.5f, 42);
      dropout->build(Shape{4, 16});
    }
    return strategy.run([&] { return (*dropout)(Tensor::full(Shape{4, 16}, 1.0f), true); });
  };
  PerReplica<Tensor> a = masks(), b = masks();
  EXPECT_NE(a[0].to_vector(), a[1].to_vector());
  EXPECT_EQ(a[0].to_vector(), b[0].to_vector());
  EXPECT_EQ(a[1].to_vector(), b[1].to_vector());
}

TEST(OneDeviceStrategy, RunsOneReplicaOnAllCores) {
  distribute::OneDeviceStrategy strategy("/cpu:0");
  EXPECT_EQ(strategy.num_replicas_in_sync(), 1);
  EXPECT_EQ(strategy.threads_per_replica(), available_cores());
  PerReplica<Tensor> out = strategy.run([] { return Tensor::scalar(3.0f); });
  EXPECT_FLOAT_EQ(strategy.reduce(ReduceOp::MEAN, out).item(), 3.0f);
}

}  // namespace
}  // namespace dtrain

namespace dtrain::distribute {
namespace {

// Timings made from a known link come back as that link: the ring among 4 workers moves
// 2·3/4 of the bytes and waits 2·3 latencies.
TEST(LinkMeasurement, FitsTheRingsCostToTheSmallestAndLargestSample) {
  using Link = MultiWorkerMirroredStrategy::LinkMeasurement;
  const double bandwidth = 1.25e9, latency = 40e-6;
  auto seconds = [&](double bytes) { return 6 * latency + 1.5 * bytes / bandwidth; };
  const Link m = Link::fit(4, {{std::size_t{1} << 26, seconds(1 << 26)}, {1024, seconds(1024)}, {1 << 20, 1.0}});
  EXPECT_NEAR(m.bytes_per_second / bandwidth, 1.0, 1e-9);
  EXPECT_NEAR(m.latency_seconds / latency, 1.0, 1e-9);
  EXPECT_EQ(m.samples.front().bytes, 1024u);  // sorted by size
  EXPECT_THROW(Link::fit(1, {{1024, 1e-4}, {2048, 2e-4}}), InvalidArgument);
  EXPECT_THROW(Link::fit(2, {{1024, 1e-4}, {1024, 2e-4}}), InvalidArgument);
}

// A transfer of 100 ms back to back that takes 94 ms after a rest saved what 6 ms carry;
// a saving within the timings' noise, or under 3%, is none.
TEST(LinkMeasurement, ABurstIsWhatATransferAfterARestSavedBeyondTheNoise) {
  using Link = MultiWorkerMirroredStrategy::LinkMeasurement;
  EXPECT_NEAR(Link::burst(0.100, 0.001, 0.094, 1e7), 6e4, 1e-6);
  EXPECT_EQ(Link::burst(0.100, 0.001, 0.098, 1e7), 0);  // 2%
  EXPECT_EQ(Link::burst(0.100, 0.004, 0.094, 1e7), 0);  // within twice the deviation
  EXPECT_EQ(Link::burst(0.100, 0.001, 0.120, 1e7), 0);  // slower after the rest
}

// Keras's padding masks under replicas: rows of different real lengths, so that the
// replicas' shares of padding differ; attention and pooling leave it out on each.
TEST(MirroredStrategy, TrainsAMaskedEncoderAsOneDevice) {
  // Rows of different real lengths, so that each replica's share of padding differs.
  Tensor ids = testing::token_rows(16, 9).padded, labels = Tensor::empty(Shape{16}, DType::i32);
  for (std::int64_t r = 0; r < 16; ++r) {
    for (std::int64_t t = 1 + r % testing::kReal; t < testing::kPadded; ++t) ids.data<float>()[r * testing::kPadded + t] = 0.0f;
    labels.data<std::int32_t>()[r] = static_cast<std::int32_t>(r % 3);
  }
  auto compiled = [](std::unique_ptr<Model> m) {
    m->compile(std::make_shared<optim::SGD>(0.2f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
    return m;
  };
  auto reference = compiled(testing::encoder(testing::kPadded, true));
  reference->fit(ids, labels, testing::quiet(8, 2));
  MirroredStrategy strategy(2);
  std::unique_ptr<Model> model;
  {
    auto scope = strategy.scope();
    model = compiled(testing::encoder(testing::kPadded, true));
  }
  model->fit(ids, labels, testing::quiet(8, 2));
  for (std::size_t i = 0; i < model->variables().size(); ++i) {
    const std::vector<float> a = model->variables()[i]->value().to_vector(),
                             b = reference->variables()[i]->value().to_vector();
    for (std::size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-5f) << model->variables()[i]->name() << " " << j;
  }
}

// GPU workers take NCCL only where every one has it and a GPU of its own; else every one
// sums through host memory, and they all say why.
TEST(GpuWorkers, NcclIsRefusedWithTheReasonWhereAWorkerLacksItOrTwoShareAGpu) {
  using distribute::detail::nccl_refusal;
  const std::vector<std::string> tasks{"chief:0", "worker:1", "worker:2"};
  EXPECT_EQ(nccl_refusal({"aa01", "bb02", "cc03"}, {"", "", ""}, tasks), "");
  EXPECT_EQ(nccl_refusal({"aa01", "bb02", "aa01"}, {"", "", ""}, tasks),
            "chief:0 and worker:2 share one GPU (aa01...), and NCCL refuses two ranks on one GPU "
            "(\"Duplicate GPU detected\")");
  EXPECT_EQ(nccl_refusal({"aa01", "bb02", "cc03"}, {"", "libnccl.so.2 could not be loaded", ""}, tasks),
            "worker:1 has no NCCL: libnccl.so.2 could not be loaded");
  EXPECT_EQ(nccl_refusal({"aa01", "", "cc03"}, {"", "", ""}, tasks),
            "worker:1's GPU has no UUID to tell it from the others'");
}

}  // namespace
}  // namespace dtrain::distribute
