#include <gtest/gtest.h>

#include <cstring>

#include "common/error_message.h"
#include "dtrain/data/example.h"

namespace dtrain::data {
namespace {


std::string hex_bytes(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

Feature floats(std::vector<float> v) { return {.kind = Feature::Kind::floats, .floats = std::move(v)}; }
Feature int64s(std::vector<std::int64_t> v) { return {.kind = Feature::Kind::int64s, .int64s = std::move(v)}; }
Feature bytes(std::vector<std::string> v) { return {.kind = Feature::Kind::bytes, .bytes = std::move(v)}; }

Tensor strings(std::vector<std::string> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return Tensor::from_vector(Shape{n}, std::move(v));
}

// The wire bytes of Example{features{feature{key: "a" value{int64_list{value: [1, -1]}}}}},
// spelled out by hand from protobuf's encoding rules (packed varints; -1 as ten bytes).
TEST(Example, SerializesAsProtobufDoes) {
  const std::string want = hex_bytes(
      "0a16"                        // Example.features, 22 bytes
      "0a14"                        //   a map entry, 20 bytes
      "0a0161"                      //     key "a"
      "120f"                        //     value: a Feature of 15 bytes
      "1a0d"                        //       int64_list, 13 bytes
      "0a0b" "01" "ffffffffffffffffff01");  //  packed, 11 bytes: 1 and -1
  EXPECT_EQ(serialize_example({{"a", int64s({1, -1})}}), want);
  const Features back = parse_example_message(want);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back.at("a").int64s, (std::vector<std::int64_t>{1, -1}));
}

TEST(Example, ReadsEveryValidEncoding) {
  const Features f{{"image", floats({0.5f, -2.0f, 3.25f})}, {"label", int64s({7})}, {"name", bytes({"x", "", "yz"})},
                   {"empty", Feature{}}};
  EXPECT_EQ(parse_example_message(serialize_example(f)).at("image").floats, f.at("image").floats);
  // Unpacked floats (wire type 5), unpacked int64s, an unknown field, and the key given twice
  // (the last value stands).
  // A message field by hand: tag, length, bytes (all short here: one-byte lengths).
  const auto field = [](int number, const std::string& payload) {
    return std::string(1, static_cast<char>(number << 3 | 2)) + static_cast<char>(payload.size()) + payload;
  };
  const auto entry = [&](const std::string& key, const std::string& feature) {
    return field(1, field(1, key) + field(2, feature));
  };
  const std::string unpacked_floats = hex_bytes("0d0000803f" "0d00000040");  // 1.0 and 2.0, one by one
  const std::string unpacked_ints = hex_bytes("0805" "0806" "0807");
  const std::string valid = field(1, entry("x", field(2, unpacked_floats)) + entry("y", field(3, unpacked_ints)) +
                                         entry("x", field(3, field(1, hex_bytes("09"))))) +
                            hex_bytes("1803");  // an unknown varint field 3
  const Features got = parse_example_message(valid);
  EXPECT_EQ(got.at("x").kind, Feature::Kind::int64s);
  EXPECT_EQ(got.at("x").int64s, (std::vector<std::int64_t>{9}));
  EXPECT_EQ(got.at("y").int64s, (std::vector<std::int64_t>{5, 6, 7}));
  // Cut anywhere, it is an error naming a byte, never a crash.
  for (std::size_t n = 1; n < valid.size(); ++n) {
    const std::string m = testing::message_of<InvalidArgument>([&] { parse_example_message(std::string_view(valid).substr(0, n)); });
    if (m == "no error") continue;  // some prefixes are whole messages
    EXPECT_NE(m.find("Example: not a valid message: "), std::string::npos) << m;
    EXPECT_NE(m.find(" at byte "), std::string::npos) << m;
  }
}

TEST(Example, ParsesAgainstASpecOneExampleOrABatch) {
  const std::string a = serialize_example({{"x", floats({1, 2, 3, 4})}, {"id", int64s({10})},
                                           {"tags", bytes({"p", "q"})}, {"seq", int64s({1, 2, 3, 4, 5, 6})}});
  const std::string b = serialize_example({{"x", floats({5, 6, 7, 8})}, {"tags", bytes({"r"})}, {"seq", int64s({9, 9})}});
  using Kind = FeatureSpec::Kind;
  const std::vector<FeatureSpec> specs{
      {.key = "x", .kind = Kind::fixed_len, .dtype = DType::f32, .shape = Shape{2, 2}},
      {.key = "id", .kind = Kind::fixed_len, .dtype = DType::i32, .shape = Shape{},
       .default_value = Tensor::from_vector(Shape{}, std::span<const std::int32_t>(std::vector<std::int32_t>{-1}))},
      {.key = "tags", .kind = Kind::var_len, .dtype = DType::string},
      {.key = "seq", .kind = Kind::fixed_len_sequence, .dtype = DType::i32, .shape = Shape{2}}};
  Tensor one = Tensor::empty(Shape{}, DType::string);
  *one.data<std::string>() = a;
  const auto single = parse_examples(one, specs);
  EXPECT_EQ(single[0].values.shape(), (Shape{2, 2}));
  EXPECT_EQ(single[0].values.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(single[1].values.data<std::int32_t>()[0], 10);
  EXPECT_EQ(single[2].values.shape(), (Shape{2}));
  EXPECT_EQ(single[2].indices.shape(), (Shape{2, 1}));
  EXPECT_EQ(single[3].values.shape(), (Shape{3, 2}));

  const auto batch = parse_examples(strings({a, b}), specs);
  EXPECT_EQ(batch[0].values.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(batch[0].values.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(batch[1].values.data<std::int32_t>()[1], -1);  // the default for the missing id
  // var_len: a sparse [2, 2]: (0,0) p, (0,1) q, (1,0) r.
  EXPECT_EQ(batch[2].values.data<std::string>()[2], "r");
  const auto* idx = batch[2].indices.data<std::int32_t>();
  EXPECT_EQ(std::vector<std::int32_t>(idx, idx + 6), (std::vector<std::int32_t>{0, 0, 0, 1, 1, 0}));
  EXPECT_EQ(batch[2].dense_shape.data<std::int32_t>()[1], 2);
  // fixed_len_sequence: padded to the longest with zeros, [2, 3, 2].
  EXPECT_EQ(batch[3].values.shape(), (Shape{2, 3, 2}));
  const auto* seq = batch[3].values.data<std::int32_t>();
  EXPECT_EQ(std::vector<std::int32_t>(seq + 6, seq + 12), (std::vector<std::int32_t>{9, 9, 0, 0, 0, 0}));
}

TEST(Example, WhatDoesNotFitTheSpecIsNamed) {
  const std::string e = serialize_example({{"x", floats({1, 2, 3})}, {"n", int64s({std::int64_t{1} << 40})}});
  const Tensor batch = strings({e, e});
  auto m = testing::message_of<InvalidArgument>([&] { parse_examples(batch, {{.key = "x", .dtype = DType::f32, .shape = Shape{4}}}); });
  EXPECT_NE(m.find("parse_example: example 0: feature 'x' has 3 values where its shape [4] holds 4"), std::string::npos) << m;
  m = testing::message_of<InvalidArgument>([&] { parse_examples(batch, {{.key = "x", .dtype = DType::i32, .shape = Shape{3}}}); });
  EXPECT_NE(m.find("feature 'x': the Example holds a float_list where the spec asks for int64"), std::string::npos) << m;
  m = testing::message_of<InvalidArgument>([&] { parse_examples(batch, {{.key = "missing", .dtype = DType::f32, .shape = Shape{}}}); });
  EXPECT_NE(m.find("feature 'missing' (float32) is required but the Example has none"), std::string::npos) << m;
  m = testing::message_of<InvalidArgument>([&] { parse_examples(batch, {{.key = "n", .dtype = DType::i32, .shape = Shape{}}}); });
  EXPECT_NE(m.find("the value 1099511627776 is beyond int32"), std::string::npos) << m;
  m = testing::message_of<InvalidArgument>([&] { parse_examples(strings({e, e.substr(0, 9)}), {{.key = "x", .dtype = DType::f32, .shape = Shape{3}}}); });
  EXPECT_NE(m.find("parse_example: example 1: Example: not a valid message: "), std::string::npos) << m;
}

// The bytes tf.io.serialize_tensor gives for tf.constant([1.0, 2.0]) and for the string
// scalar "ab": dtype, shape (dims of size 2; none for a scalar), then tensor_content or
// string_val.
TEST(TensorProto, SerializesAsTensorFlowDoes) {
  const std::string floats_proto = hex_bytes("0801" "1204" "12020802" "2208" "0000803f" "00000040");
  EXPECT_EQ(serialize_tensor(Tensor::from_vector(Shape{2}, {1.0f, 2.0f})), floats_proto);
  EXPECT_EQ(parse_tensor(floats_proto, DType::f32).to_vector(), (std::vector<float>{1, 2}));
  Tensor text = Tensor::empty(Shape{}, DType::string);
  *text.data<std::string>() = "ab";
  const std::string string_proto = hex_bytes("0807" "1200" "42026162");
  EXPECT_EQ(serialize_tensor(text), string_proto);
  EXPECT_EQ(*parse_tensor(string_proto, DType::string).data<std::string>(), "ab");
  // An int64 tensor (DataType 9) as int32, a value given once for a [2, 3] shape, a type
  // that does not match.
  const std::string int64_proto = hex_bytes("0809" "1208" "12020802" "12020803" "5201" "07");
  const Tensor sevens = parse_tensor(int64_proto, DType::i32);
  EXPECT_EQ(sevens.shape(), (Shape{2, 3}));
  EXPECT_EQ(sevens.data<std::int32_t>()[5], 7);
  EXPECT_NE(testing::message_of<InvalidArgument>([&] { parse_tensor(floats_proto, DType::i32); }).find("the serialized tensor is float32, out_type int32"),
            std::string::npos);
  const std::string m = testing::message_of<InvalidArgument>([&] { parse_tensor(floats_proto.substr(0, floats_proto.size() - 1), DType::f32); });
  EXPECT_NE(m.find("TensorProto: not a valid message: a length of 8 bytes where 7 are left at byte"), std::string::npos) << m;
}

TEST(DecodeRaw, ReadsEachStringAsAnArray) {
  std::string two(8, '\0');
  const float values[2] = {1.5f, -2.0f};
  std::memcpy(two.data(), values, 8);
  const Tensor out = decode_raw(strings({two, two, two}), DType::f32);
  EXPECT_EQ(out.shape(), (Shape{3, 2}));
  EXPECT_EQ(out.to_vector()[5], -2.0f);
  std::string big(4, '\0');
  big[3] = 1;  // 1 as a big-endian int32
  EXPECT_EQ(decode_raw(strings({big}), DType::i32, false).data<std::int32_t>()[0], 1);
  EXPECT_NE(testing::message_of<InvalidArgument>([&] { decode_raw(strings({two, "abc"}), DType::u8); }).find("element 1 has 3 bytes and element 0 8"),
            std::string::npos);
  EXPECT_NE(testing::message_of<InvalidArgument>([&] { decode_raw(strings({"abc"}), DType::f32); }).find("3 bytes are not a whole number of float32"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain::data
