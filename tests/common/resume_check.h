// A job stopped in its second epoch and resumed from its BackupAndRestore backup, as a new
// process would (fresh weights, then the backup's), against the same job left alone: the
// strategies' check that resuming loses and repeats nothing.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "dtrain/dtrain.h"

namespace dtrain::testing {

// `make` builds the model (under its strategy's scope); trained 3 epochs of 6 steps, once
// whole and once interrupted at step 9 and resumed from backups every 2 steps in
// `backups`: the resumed run starts at step 8 and ends at the whole run's weights and
// step count, bit for bit.
inline void expect_resumes_bit_for_bit(const std::function<std::unique_ptr<Model>()>& make, const std::string& backups) {
  const data::Split d = data::make_synthetic(192, 10, 4, 8, data::SyntheticLabels::teacher);
  FitOptions o{.epochs = 3, .batch_size = 32, .seed = 4, .verbose = 0};
  auto reference = make();
  reference->fit(d.x, d.y, o);

  struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted") {}
  };
  auto stop = std::make_shared<LambdaCallback>();
  auto seen = std::make_shared<int>(0);
  stop->batch_begin = [seen](std::int64_t, const Logs&) {
    if ((*seen)++ == 8) throw Interrupted();  // in the second epoch
  };
  auto first = make();
  o.callbacks = {std::make_shared<train::BackupAndRestore>(backups, train::BackupAndRestoreOptions{.save_freq = 2, .out = nullptr}),
                 stop};
  EXPECT_THROW(first->fit(d.x, d.y, o), Interrupted);
  auto second = make();  // as a new process would: fresh weights, overwritten by the backup
  // It starts where the backup was taken (every 2 steps, so at step 8), not from scratch.
  auto started_at = std::make_shared<std::int64_t>(-1);
  auto watch = std::make_shared<LambdaCallback>();
  Model* resumed = second.get();
  watch->batch_begin = [resumed, started_at](std::int64_t, const Logs&) {
    if (*started_at < 0) *started_at = resumed->optimizer().iterations();
  };
  o.callbacks = {std::make_shared<train::BackupAndRestore>(backups, train::BackupAndRestoreOptions{.save_freq = 2, .out = nullptr}),
                 watch};
  second->fit(d.x, d.y, o);
  EXPECT_EQ(*started_at, 8);
  EXPECT_EQ(second->optimizer().iterations(), reference->optimizer().iterations());
  const auto a = second->variables(), b = reference->variables();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]->value().to_vector(), b[i]->value().to_vector()) << a[i]->name();
}

}  // namespace dtrain::testing
