// Record files (dtrain's, and TFRecord's framing) and what they hold: each record decoded
// as an element (decode_element), and the whole input read as a saved iterator state
// (IteratorState::from_bytes), the other byte format the data layer reads back.
#include <string_view>

#include "dtrain/data/dataset.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dtrain::fuzz::write_input(data, size);
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    dtrain::data::Iterator it = dtrain::data::Dataset::records({path}).make_iterator();
    while (auto record = it.next()) dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::decode_element((*record)[0]); });
  });
  // The same bytes as a TFRecord file (TensorFlow's framing of records).
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    dtrain::data::Iterator it = dtrain::data::Dataset::tfrecord({path}).make_iterator();
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
  return 0;
}
