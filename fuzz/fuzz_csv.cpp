// CSV files through Dataset::csv. The first byte picks the options (header or not, the
// delimiter, a label column, non-finite cells allowed); the rest is the file.
#include "dtrain/data/dataset.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t knobs = data[0];
  dtrain::data::CsvOptions o;
  o.header = knobs & 1;
  o.delimiter = (knobs & 2) ? ';' : ',';
  o.allow_non_finite = knobs & 4;
  if (knobs & 8) o.label_column = o.header ? "label" : "0";
  if (knobs & 16) o.select_columns = {o.header ? "a" : "1", "2"};
  const std::string& path = dtrain::fuzz::write_input(data + 1, size - 1);
  dtrain::fuzz::expect_only_dtrain_errors([&] {
    dtrain::data::Iterator it = dtrain::data::Dataset::csv({path}, o).make_iterator();
    while (it.next()) {
    }
  });
  return 0;
}
