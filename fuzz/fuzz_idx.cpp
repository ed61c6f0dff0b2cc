// IDX image and label files, plain or gzip: every reader of the format, and the labels
// checked against a class count.
#include "dtrain/data/idx.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dtrain::fuzz::write_input(data, size);
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::read_idx_images(path); });
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::read_idx_image_bytes(path); });
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::read_idx_labels(path); });
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::data::read_idx_labels(path, 10); });
  return 0;
}
