// The protobuf messages TensorFlow's data files carry, read and written without protobuf's
// library: tf.train.Example (a map of named features, each a list of byte strings, floats
// or int64s) with the parsing tf.io.parse_single_example and parse_example do against a
// feature spec, tf.io.serialize_tensor's TensorProto, and tf.io.decode_raw. Integers are
// held as int32 (dtrain's integer type), and one beyond its range is an error naming it.
// Bad bytes are an InvalidArgument naming the message, the feature and the byte offset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

// One tf.train.Feature: one of its three lists (none: a Feature with no list set).
struct Feature {
  enum class Kind : std::uint8_t { none, bytes, floats, int64s };
  Kind kind = Kind::none;
  std::vector<std::string> bytes;
  std::vector<float> floats;
  std::vector<std::int64_t> int64s;
};
using Features = std::map<std::string, Feature>;

// tf.train.Example <-> its wire bytes. serialize_example writes the features in key order
// with packed lists (as TensorFlow's deterministic serialization does); parse reads any
// valid encoding (packed or not, fields in any order, unknown fields skipped, a repeated
// key's last value kept).
std::string serialize_example(const Features& features);
Features parse_example_message(std::string_view bytes);

// A feature spec, as tf.io.FixedLenFeature, VarLenFeature and FixedLenSequenceFeature.
// dtype: float32 (a float_list), int32 (an int64_list) or string (a bytes_list).
struct FeatureSpec {
  enum class Kind : std::uint8_t { fixed_len, var_len, fixed_len_sequence };
  std::string key;
  Kind kind = Kind::fixed_len;
  DType dtype = DType::f32;
  Shape shape;                  // fixed_len: the value's; fixed_len_sequence: each item's
  std::optional<Tensor> default_value;  // fixed_len: when missing; fixed_len_sequence: padding
  bool allow_missing = false;   // fixed_len_sequence: a missing feature is [0, shape...]
};

// What parsing gives for one spec: a dense tensor, or for var_len a sparse one (indices
// int32 [n, rank], values [n], dense_shape int32 [rank]).
struct ParsedFeature {
  Tensor values;
  Tensor indices, dense_shape;  // var_len only
};

// serialized: a string scalar (parse_single_example: fixed_len [shape], fixed_len_sequence
// [n, shape...], var_len rank 1) or a string vector of a batch (parse_example: a batch
// axis first, fixed_len_sequence padded to the longest, var_len rank 2). One result per
// spec, in the specs' order.
std::vector<ParsedFeature> parse_examples(const Tensor& serialized, const std::vector<FeatureSpec>& specs);

// tf.io.serialize_tensor / parse_tensor: a TensorProto (dtype, shape, tensor_content or
// string_val). parse_tensor also reads the typed value lists (float_val, int_val, ...) and
// a value given once for the whole shape, as TensorFlow makes constants.
std::string serialize_tensor(const Tensor& t);
Tensor parse_tensor(std::string_view bytes, DType out_type);

// tf.io.decode_raw: each string of `bytes` as an array of out_type (uint8, int32, float32,
// bfloat16), giving bytes.shape + [n]; every string must have the same length, a whole
// number of elements. little_endian false swaps each element's bytes.
Tensor decode_raw(const Tensor& bytes, DType out_type, bool little_endian = true);

}  // namespace dtrain::data
