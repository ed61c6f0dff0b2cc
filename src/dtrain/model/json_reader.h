// Strict reading of JSON objects for configs: every error names the JSON path of the key
// ("model.config.layers[1].config.units") and what was expected; unknown keys are errors,
// so a typo is never silently ignored.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/core/error.h"

namespace dtrain {

class JsonReader {
 public:
  JsonReader(const nlohmann::json& value, std::string path) : value_(value), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  const nlohmann::json& raw() const { return value_; }
  bool has(const std::string& key) const { return value_.is_object() && value_.contains(key) && !value_[key].is_null(); }
  JsonReader child(const std::string& key) const;     // value_[key], which must exist
  JsonReader element(std::size_t index) const;        // value_[index] of an array
  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // Throws InvalidArgument unless this is an object whose keys are all in `allowed`.
  void expect_keys(std::initializer_list<const char*> allowed) const;
  void expect_keys(const std::vector<std::string>& allowed) const;
  void expect_object() const;
  void expect_array() const;
  std::size_t size() const { return value_.size(); }

  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  double get_number(const std::string& key) const;
  double get_number(const std::string& key, double fallback) const;
  std::int64_t get_int(const std::string& key) const;
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::optional<std::int64_t> get_optional_int(const std::string& key) const;
  // An int within [lo, hi]; the error names the key and the range.
  int get_int32(const std::string& key, int fallback, int lo, int hi) const;

  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  const nlohmann::json& at(const std::string& key) const;
  const nlohmann::json& value_;
  std::string path_;
};

// Whether an error message begins with the JSON path `path` or a path below it
// ("optimizer.momentum: ..." names "optimizer"), so that a caller adding context knows the
// key is said already.
bool names_json_path(const std::string& message, const std::string& path);

// The deepest nesting of arrays and objects a document read from outside may have: the
// code that walks a document recurses, and a config nested 100,000 deep overflowed the
// stack. No config or header of dtrain's comes near it.
inline constexpr int kMaxJsonDepth = 512;
// A parser callback that refuses a document nested deeper, naming `source` (the error is
// InvalidArgument, which the caller may rethrow as its own kind).
nlohmann::json::parser_callback_t json_depth_limit(const std::string& source);

// Parses text as JSON; a syntax error, or nesting deeper than kMaxJsonDepth, is an
// InvalidArgument naming `source` (and the byte).
nlohmann::json parse_json(const std::string& text, const std::string& source);

}  // namespace dtrain
