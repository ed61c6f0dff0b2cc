// Record files (dtrain's, and TFRecord's framing, plain and compressed) and what they hold: each record decoded
// as an element (decode_element), and the whole input read as a saved iterator state
// (IteratorState::from_bytes), the other byte format the data layer reads back.
#include <string_view>

#include "dtrain/data/dataset.h"
#include "dtrain/data/example.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dtrain::fuzz::write_input(data, size);
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    dtrain::data::Iterator it = dtrain::data::Dataset::records({path}).make_iterator();
    while (auto record = it.next()) dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::decode_element((*record)[0]); });
  });
  // The same bytes as a TFRecord file (TensorFlow's framing of records), uncompressed,
  // and as zlib's and gzip's streams of one.
  for (const auto compression : {dtrain::data::Compression::none, dtrain::data::Compression::zlib,
                                 dtrain::data::Compression::gzip})
    dtrain::fuzz::expect_only_dtrain_errors([&] {
      dtrain::data::Iterator it = dtrain::data::Dataset::tfrecord({path}, compression).make_iterator();
      while (it.next()) {
      }
    });
  // The same bytes as one record's contents, without a record file's checksums in the way.
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    dtrain::Tensor record = dtrain::Tensor::empty({static_cast<std::int64_t>(size)}, dtrain::DType::u8);
    if (size) std::copy(data, data + size, record.data<std::uint8_t>());
    dtrain::data::decode_element(record);
  });
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    dtrain::data::IteratorState::from_bytes(std::string_view(reinterpret_cast<const char*>(data), size));
  });
  // The same bytes as the protobuf messages TensorFlow's files carry: a tf.train.Example,
  // whole and against a spec of each kind, and a TensorProto of each type.
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::parse_example_message(bytes); });
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    using Spec = dtrain::data::FeatureSpec;
    const std::vector<Spec> specs{
        {.key = "x", .kind = Spec::Kind::fixed_len, .dtype = dtrain::DType::f32, .shape = dtrain::Shape{2},
         .default_value = dtrain::Tensor::full(dtrain::Shape{2}, 0.0f)},
        {.key = "y", .kind = Spec::Kind::var_len, .dtype = dtrain::DType::i32},
        {.key = "z", .kind = Spec::Kind::fixed_len_sequence, .dtype = dtrain::DType::string, .allow_missing = true}};
    dtrain::Tensor batch = dtrain::Tensor::from_vector(dtrain::Shape{2}, std::vector<std::string>{std::string(bytes), ""});
    dtrain::data::parse_examples(batch, specs);
  });
  for (const auto type : {dtrain::DType::f32, dtrain::DType::i32, dtrain::DType::u8, dtrain::DType::bf16, dtrain::DType::string})
    dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::parse_tensor(bytes, type); });
  return 0;
}
