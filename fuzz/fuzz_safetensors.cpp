// safetensors files through load_safetensors: the header length, the JSON header, each
// tensor's dtype, shape and offsets against the bytes that follow.
#include "dtrain/model/safetensors.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dtrain::fuzz::write_input(data, size);
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::load_safetensors(path); });
  return 0;
}
