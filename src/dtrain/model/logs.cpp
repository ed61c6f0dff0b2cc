// Ordered named values.
#include "dtrain/model/logs.h"

#include "dtrain/core/error.h"

namespace dtrain {

void Logs::set(const std::string& name, double value) {
  for (auto& [k, v] : items_)
    if (k == name) {
      v = value;
      return;
    }
  items_.emplace_back(name, value);
}

bool Logs::contains(const std::string& name) const {
  for (const auto& [k, v] : items_)
    if (k == name) return true;
  return false;
}

double Logs::at(const std::string& name) const {
  for (const auto& [k, v] : items_)
    if (k == name) return v;
  std::string keys;
  for (const auto& [k, v] : items_) keys += (keys.empty() ? "" : ", ") + k;
  DTRAIN_THROW(InvalidArgument, "no log named '", name, "' (available: ", keys.empty() ? "none" : keys, ")");
}

void Logs::update(const Logs& other) {
  for (const auto& [k, v] : other.items()) set(k, v);
}

}  // namespace dtrain
