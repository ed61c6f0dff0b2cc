// TF_CONFIG values through parse_tf_config: the cluster, the task and every address.
#include "dtrain/cluster/tf_config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::cluster::parse_tf_config(json); });
  return 0;
}
