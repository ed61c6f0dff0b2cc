// Path-aware JSON access.
#include "dtrain/model/json_reader.h"

namespace dtrain {

nlohmann::json::parser_callback_t json_depth_limit(const std::string& source) {
  return [source](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      DTRAIN_THROW(InvalidArgument, source, ": JSON nested more than ", kMaxJsonDepth, " arrays or objects deep");
    return true;
  };
}

nlohmann::json parse_json(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text, json_depth_limit(source));
  } catch (const nlohmann::json::parse_error& e) {
    DTRAIN_THROW(InvalidArgument, source, ": invalid JSON at byte ", e.byte, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {  // a number too large for a double (1e999)
    DTRAIN_THROW(InvalidArgument, source, ": invalid JSON: ", e.what());
  }
}

bool names_json_path(const std::string& message, const std::string& path) {
  if (path.empty() || message.compare(0, path.size(), path) != 0) return false;
  const char next = message.size() > path.size() ? message[path.size()] : '\0';
  return next == ':' || next == '.' || next == '[';
}

void JsonReader::fail(const std::string& key, const std::string& message) const {
  const std::string where = key.empty() ? (path_.empty() ? "<root>" : path_) : key_path(key);
  DTRAIN_THROW(InvalidArgument, where, ": ", message);
}

void JsonReader::expect_object() const {
  if (!value_.is_object()) fail("", "expected an object, got " + value_.dump());
}

void JsonReader::expect_array() const {
  if (!value_.is_array()) fail("", "expected an array, got " + value_.dump());
}

void JsonReader::expect_keys(std::initializer_list<const char*> allowed) const {
  expect_keys(std::vector<std::string>(allowed.begin(), allowed.end()));
}

void JsonReader::expect_keys(const std::vector<std::string>& allowed) const {
  expect_object();
  for (auto it = value_.begin(); it != value_.end(); ++it) {
    bool ok = false;
    for (const std::string& a : allowed) ok |= it.key() == a;
    if (!ok) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(it.key(), "unknown key (expected one of: " + list + ")");
    }
  }
}

const nlohmann::json& JsonReader::at(const std::string& key) const {
  expect_object();
  if (!value_.contains(key)) fail(key, "is required");
  return value_[key];
}

JsonReader JsonReader::child(const std::string& key) const { return JsonReader(at(key), key_path(key)); }

JsonReader JsonReader::element(std::size_t index) const {
  expect_array();
  if (index >= value_.size()) fail("", "has no element " + std::to_string(index));
  return JsonReader(value_[index], path_ + "[" + std::to_string(index) + "]");
}

std::string JsonReader::get_string(const std::string& key) const {
  const auto& v = at(key);
  if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
  return v.get<std::string>();
}

std::string JsonReader::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

double JsonReader::get_number(const std::string& key) const {
  const auto& v = at(key);
  if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
  return v.get<double>();
}

double JsonReader::get_number(const std::string& key, double fallback) const {
  return has(key) ? get_number(key) : fallback;
}

std::int64_t JsonReader::get_int(const std::string& key) const {
  const auto& v = at(key);
  if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    fail(key, "the integer " + v.dump() + " is too large");
  return v.get<std::int64_t>();
}

int JsonReader::get_int32(const std::string& key, int fallback, int lo, int hi) const {
  if (!has(key)) return fallback;
  const std::int64_t v = get_int(key);
  if (v < lo || v > hi) fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
  return static_cast<int>(v);
}

std::int64_t JsonReader::get_int(const std::string& key, std::int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

std::optional<std::int64_t> JsonReader::get_optional_int(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}

bool JsonReader::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = at(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
  return v.get<bool>();
}

}  // namespace dtrain
