// Logs: named values of a batch or an epoch ("loss", "accuracy", "val_loss", ...), kept in
// the order they were first set, which is the order Keras prints them in.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain {

class Logs {
 public:
  void set(const std::string& name, double value);
  // Sets every value of `other` (Python's dict.update).
  void update(const Logs& other);
  bool contains(const std::string& name) const;
  // Throws InvalidArgument naming the key and the keys present.
  double at(const std::string& name) const;
  const std::vector<std::pair<std::string, double>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  void clear() { items_.clear(); }

 private:
  std::vector<std::pair<std::string, double>> items_;
};

}  // namespace dtrain
