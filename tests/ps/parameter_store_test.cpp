// A parameter server's store: Adam on shards is Adam on the whole variable; a closure's
// gradients count once; a fenced worker's pushes are refused; a bad push changes nothing
// and names the task and the shard.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtrain/model/compile_config.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/ps/parameter_store.h"

namespace dtrain::distribute {
namespace {

using Key = ParameterStore::ShardKey;

Tensor ramp(const Shape& shape, float start, float step) {
  std::vector<float> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + step * static_cast<float>(i);
  return Tensor::from_vector(shape, v);
}

std::string adam_json() { return optimizer_to_json(optim::Adam(0.05f)).dump(); }

// Variable 0 ([5, 3]) in two shards of rows [0, 3) and [3, 5).
void two_shards(ParameterStore& store, const Tensor& whole) {
  std::vector<std::pair<Key, Variable>> shards;
  shards.emplace_back(Key{0, 0}, Variable("w/part_0", whole.slice(0, 3).clone()));
  shards.emplace_back(Key{0, 1}, Variable("w/part_1", whole.slice(3, 5).clone()));
  store.create(1, std::move(shards));
}

ParameterStore::Push push_of(std::uint64_t closure, const Tensor& grad, std::string task = "worker:0") {
  ParameterStore::Push p;
  p.closure = closure;
  p.task = std::move(task);
  p.incarnation = 1;
  p.optimizer_json = adam_json();
  p.gradients = {{Key{0, 0}, grad.slice(0, 3).clone()}, {Key{0, 1}, grad.slice(3, 5).clone()}};
  return p;
}

std::vector<float> stored(const ParameterStore& store) {
  std::vector<float> out;
  store.read([&](const Key&, const Tensor& v) {
    const std::vector<float> part = v.to_vector();
    out.insert(out.end(), part.begin(), part.end());
  });
  return out;
}

// The gradient of step `step` (from 1) in the tests that train a [5, 3] variable.
Tensor grad_at(std::uint64_t step) { return ramp(Shape{5, 3}, 0.3f * static_cast<float>(step), -0.07f); }

// Adam on the whole variable, from `initial`, for steps 1..steps: the reference.
std::vector<float> whole_adam(const Tensor& initial, std::uint64_t steps) {
  Variable whole("w", initial.clone());
  optim::Adam reference(0.05f);
  for (std::uint64_t step = 1; step <= steps; ++step) {
    std::vector<Variable*> vars{&whole};
    reference.apply_gradients(std::vector<Tensor>{grad_at(step)}, vars);
  }
  return whole.value().to_vector();
}

TEST(ParameterStore, AdamOnShardsIsAdamOnTheWholeVariable) {
  const Tensor initial = ramp(Shape{5, 3}, -1.0f, 0.13f);
  ParameterStore store;
  two_shards(store, initial);
  for (std::uint64_t step = 1; step <= 4; ++step) ASSERT_TRUE(store.push(push_of(step, grad_at(step))).applied);
  EXPECT_EQ(stored(store), whole_adam(initial, 4));  // elementwise: bit for bit
  EXPECT_EQ(store.statistics().version, 4);
}

// A store created from another's snapshot (a job restored from a checkpoint) goes on with
// Adam's moments and step count: 2 + 2 pushes give the 4-step Adam of the whole variable.
TEST(ParameterStore, AStoreRestoredFromASnapshotGoesOnAsTheStoreLeftAlone) {
  const Tensor initial = ramp(Shape{5, 3}, -1.0f, 0.13f);
  ParameterStore first;
  two_shards(first, initial);
  const std::vector<float> expected = whole_adam(initial, 4);
  for (std::uint64_t step = 1; step <= 2; ++step) ASSERT_TRUE(first.push(push_of(step, grad_at(step))).applied);
  const ParameterStore::Snapshot saved = first.snapshot();
  ASSERT_EQ(saved.optimizer.iterations, 2);
  ASSERT_EQ(saved.optimizer.slots.size(), 4u);  // m and v of each shard
  auto restore_into = [&](ParameterStore& store, ParameterStore::OptimizerState state) {
    std::vector<std::pair<Key, Variable>> shards;
    for (const auto& [key, value] : saved.values) shards.emplace_back(key, Variable("w/part", value.clone()));
    store.create(2, std::move(shards), 0, std::move(state));
  };
  ParameterStore restored;
  restore_into(restored, saved.optimizer);
  for (std::uint64_t step = 3; step <= 4; ++step) ASSERT_TRUE(restored.push(push_of(step, grad_at(step))).applied);
  EXPECT_EQ(stored(restored), expected);
  EXPECT_EQ(restored.snapshot().optimizer.iterations, 4);
  // Without the moments the same pushes end elsewhere: the check above can fail.
  ParameterStore forgetful;
  restore_into(forgetful, {});
  for (std::uint64_t step = 3; step <= 4; ++step) ASSERT_TRUE(forgetful.push(push_of(step, grad_at(step))).applied);
  EXPECT_NE(stored(forgetful), expected);
  // A slot of another shape is refused by name, and the store is left as it was.
  ParameterStore::OptimizerState bad = saved.optimizer;
  bad.slots[1].value = Tensor::zeros(Shape{2, 3});
  ParameterStore untouched;
  two_shards(untouched, initial);
  try {
    restore_into(untouched, bad);
    FAIL() << "a slot of the wrong shape was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("restored slot '" + bad.slots[1].name + "' [2, 3] of shard"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(stored(untouched), initial.to_vector());
}

TEST(ParameterStore, AClosureRunTwiceCountsOnce) {
  const Tensor initial = ramp(Shape{5, 3}, 0.5f, 0.01f);
  ParameterStore once, twice;
  two_shards(once, initial);
  two_shards(twice, initial);
  const Tensor grad = ramp(Shape{5, 3}, 1.0f, 0.1f);
  ASSERT_TRUE(once.push(push_of(7, grad)).applied);
  ASSERT_TRUE(twice.push(push_of(7, grad)).applied);
  const ParameterStore::PushResult again = twice.push(push_of(7, grad, "worker:1"));
  EXPECT_FALSE(again.applied);
  EXPECT_EQ(again.version, 1);
  EXPECT_EQ(stored(twice), stored(once));
  EXPECT_EQ(twice.statistics().pushes_applied, 1);
  EXPECT_EQ(twice.statistics().pushes_refused, 1);
}

TEST(ParameterStore, AFencedIncarnationsPushesAreRefusedAndALaterOnesApplied) {
  ParameterStore store;
  two_shards(store, ramp(Shape{5, 3}, 0.0f, 0.2f));
  const std::vector<float> before = stored(store);
  store.fence("worker:1", 3);
  ParameterStore::Push late = push_of(1, ramp(Shape{5, 3}, 1.0f, 0.0f), "worker:1");
  late.incarnation = 3;
  EXPECT_FALSE(store.push(late).applied);
  EXPECT_EQ(stored(store), before);
  late.incarnation = 4;  // the worker came back and the coordinator found it again
  EXPECT_TRUE(store.push(late).applied);
  // Another task is not affected by worker:1's fence.
  ParameterStore::Push other = push_of(2, ramp(Shape{5, 3}, 1.0f, 0.0f), "worker:0");
  EXPECT_TRUE(store.push(other).applied);
}

TEST(ParameterStore, ABadPushNamesTheTaskAndTheShardAndChangesNothing) {
  ParameterStore store;
  two_shards(store, ramp(Shape{5, 3}, 0.0f, 0.2f));
  const std::vector<float> before = stored(store);
  ParameterStore::Push unknown = push_of(1, ramp(Shape{5, 3}, 1.0f, 0.0f), "worker:2");
  unknown.gradients.emplace_back(Key{4, 0}, Tensor::zeros(Shape{1}));
  try {
    store.push(unknown);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("worker:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shard 0 of variable 4"), std::string::npos) << e.what();
  }
  ParameterStore::Push wrong_shape = push_of(2, ramp(Shape{5, 3}, 1.0f, 0.0f));
  wrong_shape.gradients[1].second = Tensor::zeros(Shape{2, 4});
  try {
    store.push(wrong_shape);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w/part_1'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 4]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stored(store), before);
  EXPECT_EQ(store.statistics().version, 0);
  // A closure refused for a bad push may still come with a good one.
  EXPECT_TRUE(store.push(push_of(1, ramp(Shape{5, 3}, 1.0f, 0.0f))).applied);
}

TEST(ParameterStore, WorkersWithAnotherOptimizerOrClippingAreRefused) {
  ParameterStore store;
  two_shards(store, ramp(Shape{5, 3}, 0.0f, 0.2f));
  ASSERT_TRUE(store.push(push_of(1, ramp(Shape{5, 3}, 1.0f, 0.0f))).applied);
  ParameterStore::Push sgd = push_of(2, ramp(Shape{5, 3}, 1.0f, 0.0f), "worker:3");
  sgd.optimizer_json = optimizer_to_json(optim::SGD(0.1f)).dump();
  try {
    store.push(sgd);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("worker:3's optimizer"), std::string::npos) << e.what();
  }
  ParameterStore fresh;
  two_shards(fresh, ramp(Shape{5, 3}, 0.0f, 0.2f));
  ParameterStore::Push clipped = push_of(1, ramp(Shape{5, 3}, 1.0f, 0.0f));
  clipped.optimizer_json = optimizer_to_json(optim::Adam(0.05f, {}, {.clipnorm = 1.0f})).dump();
  try {
    fresh.push(clipped);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("clipnorm"), std::string::npos) << e.what();
  }
}

// A step's change to a non-trainable variable (batch norm's moving statistics) is added
// with its closure's gradients: once, even when the closure runs again; nothing from a
// refused or malformed push; and, when updates are synchronous, the mean of the changes
// that made the update.
TEST(ParameterStore, AStepsChangeToAMovingStatisticIsAddedOnceAndAveragedWhenSynchronous) {
  const Tensor initial = ramp(Shape{5, 3}, 0.5f, 0.01f);
  const Tensor moving = ramp(Shape{4}, 1.0f, 0.5f);
  auto make = [&](ParameterStore& store, int aggregate) {
    std::vector<std::pair<Key, Variable>> shards;
    shards.emplace_back(Key{0, 0}, Variable("w/part_0", initial.slice(0, 3).clone()));
    shards.emplace_back(Key{0, 1}, Variable("w/part_1", initial.slice(3, 5).clone()));
    shards.emplace_back(Key{1, 0}, Variable("moving_mean", moving.clone(), false));
    store.create(1, std::move(shards), aggregate);
  };
  auto moving_now = [](const ParameterStore& store) {
    std::vector<float> out;
    store.read([&](const Key& key, const Tensor& v) {
      if (key.variable == 1) out = v.to_vector();
    });
    return out;
  };
  auto with_change = [](ParameterStore::Push p, const Tensor& change) {
    p.changes = {{Key{1, 0}, change.clone()}};
    return p;
  };
  const Tensor c1 = Tensor::from_vector(Shape{4}, {0.25f, -0.5f, 1.0f, 0.0f});
  const Tensor c2 = Tensor::from_vector(Shape{4}, {0.75f, 0.5f, -3.0f, 2.0f});
  const Tensor grad = ramp(Shape{5, 3}, 1.0f, 0.1f);

  ParameterStore async;
  make(async, 0);
  ASSERT_TRUE(async.push(with_change(push_of(1, grad), c1)).applied);
  EXPECT_EQ(moving_now(async), (std::vector<float>{1.25f, 1.0f, 3.0f, 2.5f}));
  // The closure run again elsewhere: refused, its change too.
  EXPECT_FALSE(async.push(with_change(push_of(1, grad, "worker:1"), c2)).applied);
  EXPECT_EQ(moving_now(async), (std::vector<float>{1.25f, 1.0f, 3.0f, 2.5f}));
  // A change of another shape names the variable's shard and changes nothing.
  try {
    async.push(with_change(push_of(2, grad), Tensor::zeros(Shape{3})));
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[3] change for 'moving_mean'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(moving_now(async), (std::vector<float>{1.25f, 1.0f, 3.0f, 2.5f}));
  EXPECT_EQ(async.statistics().version, 1);

  ParameterStore sync;
  make(sync, 2);
  ASSERT_TRUE(sync.push(with_change(push_of(1, grad, "worker:0"), c1)).applied);
  EXPECT_EQ(moving_now(sync), moving.to_vector());  // the update waits for the second worker
  ASSERT_TRUE(sync.push(with_change(push_of(2, grad, "worker:1"), c2)).applied);
  EXPECT_EQ(moving_now(sync), (std::vector<float>{1.5f, 1.5f, 1.0f, 3.5f}));
  // A push computed from the version before that update is dropped, its change with it.
  ParameterStore::Push late = with_change(push_of(3, grad, "worker:0"), c1);
  late.pulled_version = 0;
  const ParameterStore::PushResult dropped = sync.push(late);
  EXPECT_TRUE(dropped.dropped);
  EXPECT_FALSE(dropped.applied);
  EXPECT_EQ(moving_now(sync), (std::vector<float>{1.5f, 1.5f, 1.0f, 3.5f}));
}

}  // namespace
}  // namespace dtrain::distribute
