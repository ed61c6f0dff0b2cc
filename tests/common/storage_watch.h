// A callback that checks, after every training batch, that each of the model's variables
// still lies where it lay when training began: an update that copied a variable (copy on
// write, with something else holding its storage) would move it.
#pragma once

#include <cstdint>
#include <vector>

#include "dtrain/model/model.h"

namespace dtrain::testing {

class StorageWatch : public Callback {
 public:
  void on_train_begin(const Logs&) override {
    at_.clear();
    for (Variable* v : model_->variables()) at_.push_back(v->value().raw_data());
  }
  void on_train_batch_end(std::int64_t, const Logs&) override {
    const std::vector<Variable*> vars = model_->variables();
    for (std::size_t i = 0; i < vars.size(); ++i)
      if (vars[i]->value().raw_data() != at_[i]) ++moves;
    ++batches;
  }

  int batches = 0;  // batches seen
  int moves = 0;    // (variable, batch) pairs where the variable had moved

 private:
  std::vector<const void*> at_;
};

}  // namespace dtrain::testing
