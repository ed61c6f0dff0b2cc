// Files that lie: headers claiming more than the file holds, sizes that overflow, cells
// that are not finite, labels out of range. Each must fail with a message naming the file
// and what was wrong, before anything is allocated for the claimed size. The inputs the
// fuzz targets found (fuzz/regressions/) are replayed here too.
#include <gtest/gtest.h>
#include <zlib.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <cstring>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/core/allocator.h"
#include "dtrain/data/dataset.h"
#include "dtrain/data/datasets.h"
#include "dtrain/data/idx.h"

// The largest single request to operator new since the last reset: a reader that sizes a
// buffer from a header before checking it shows up here even when the allocation succeeds.
namespace {
std::atomic<std::size_t> largest_new{0};
}  // namespace

void* operator new(std::size_t n) {
  for (std::size_t seen = largest_new.load(); n > seen && !largest_new.compare_exchange_weak(seen, n);) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// GCC pairs operator new with delete when it inlines them and takes the malloc/free
// inside for a mismatch; the replacements are a matched pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace dtrain::data {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class UntrustedFiles : public testing::TempDirTest {
 protected:
  static std::string idx_header(std::vector<std::uint32_t> dims) {
    std::string h = {0, 0, 0x08, static_cast<char>(dims.size())};
    for (auto d : dims)
      for (int s = 24; s >= 0; s -= 8) h += static_cast<char>((d >> s) & 0xff);
    return h;
  }
  std::string write_gz(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }
  // The IoError message of fn, checking that no buffer larger than `budget` was asked for.
  static std::string failure(const std::function<void()>& fn, std::size_t budget = kMiB) {
    largest_new = 0;
    const std::size_t tensors_before = cpu_allocator().stats().peak_bytes_in_use;
    const std::string m = testing::message_of<IoError>(fn);
    EXPECT_LE(largest_new.load(), budget) << m;
    EXPECT_LE(cpu_allocator().stats().peak_bytes_in_use, std::max(tensors_before, budget)) << m;
    return m;
  }
  // Bytes as a record dataset yields them: uint8 [size].
  static Tensor as_record(const std::string& bytes) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(bytes.size())}, DType::u8);
    std::memcpy(t.raw_data(), bytes.data(), bytes.size());
    return t;
  }
  static void expect_names(const std::string& message, std::initializer_list<std::string> parts) {
    for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' in: " << message;
  }
};

// The 116-byte file of the report: 16 bytes of header claiming 12.6e9 values, 100 of data.
TEST_F(UntrustedFiles, IdxHeaderClaimingHugeDimensionsFailsBeforeAllocating) {
  const std::string bytes = idx_header({60000, 4096, 51200}) + std::string(100, '\x07');
  ASSERT_EQ(bytes.size(), 116u);
  for (bool gz : {false, true}) {
    const std::string path = gz ? write_gz("huge.gz", bytes) : write("huge", bytes);
    const std::string m = failure([&] { read_idx_images(path); });
    expect_names(m, {path, "truncated", "claims 12582912000000 bytes of values (60000 x 4096 x 51200)",
                     "holds 100 after the header"});
  }
}

TEST_F(UntrustedFiles, IdxCountNearTwoToThe31IsTruncatedNotBadAlloc) {
  const std::string bytes = idx_header({0x7fffffff}) + std::string(100, '\x01');
  for (bool gz : {false, true}) {
    const std::string path = gz ? write_gz("labels.gz", bytes) : write("labels", bytes);
    expect_names(failure([&] { read_idx_labels(path); }), {path, "claims 2147483647 bytes", "holds 100"});
  }
}

TEST_F(UntrustedFiles, IdxExtentsThatOverflowAreNamed) {
  const std::string path = write("overflow", idx_header({0xffffffff, 0xffffffff, 0xffffffff}) + "abc");
  expect_names(failure([&] { read_idx_images(path); }),
               {path, "4294967295 x 4294967295 x 4294967295 multiply past what can be addressed"});
  // No values at all, but extents whose product a shape could not hold.
  const std::string empty = write("empty", idx_header({0, 0xffffffff, 0xffffffff}));
  expect_names(failure([&] { read_idx_images(empty); }), {empty, "multiply past"});
}

TEST_F(UntrustedFiles, IdxGzipReadsGrowWithTheData) {
  // 300 000 real values: read through, in chunks, whatever their size.
  std::string bytes = idx_header({3, 100, 1000});
  for (int i = 0; i < 300000; ++i) bytes += static_cast<char>(i % 251);
  const Tensor x = read_idx_image_bytes(write_gz("big.gz", bytes));
  ASSERT_EQ(x.shape(), Shape({3, 100000}));
  EXPECT_EQ(x.data<std::uint8_t>()[299999], 299999 % 251);
}

TEST_F(UntrustedFiles, IdxLabelOutOfRangeNamesTheFileIndexAndClassCount) {
  const std::string path = write("labels", idx_header({4}) + std::string{1, 2, static_cast<char>(200), 3});
  EXPECT_EQ(read_idx_labels(path).numel(), 4);
  expect_names(testing::message_of<IoError>([&] { read_idx_labels(path, 10); }),
               {path, "label 200 at index 2", "below 10"});
}

TEST_F(UntrustedFiles, FashionMnistLabelOutOfRangeNamesTheLabelsFile) {
  write("train-images-idx3-ubyte", idx_header({2, 1, 1}) + std::string{1, 2});
  const std::string labels = write("train-labels-idx1-ubyte", idx_header({2}) + std::string{1, 12});
  write("t10k-images-idx3-ubyte", idx_header({1, 1, 1}) + std::string{1});
  write("t10k-labels-idx1-ubyte", idx_header({1}) + std::string{1});
  expect_names(testing::message_of<IoError>([&] { load_fashion_mnist(dir_.string()); }),
               {labels, "label 12 at index 1", "below 10"});
}

// A record file's length field (with a valid checksum) claiming 2^40 bytes.
TEST_F(UntrustedFiles, RecordClaimingTwoToThe40BytesFailsBeforeAllocating) {
  const std::string path = (dir_ / "r.rec").string();
  {
    RecordWriter w(path);
    w.write("hello");
    w.close();
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::uint64_t claimed = std::uint64_t{1} << 40;
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>(claimed >> (8 * i));
  const auto sum = static_cast<std::uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), 8));
  for (int i = 0; i < 4; ++i) bytes[static_cast<std::size_t>(8 + i)] = static_cast<char>(sum >> (8 * i));
  const std::string lying = write("lying.rec", bytes);
  const std::string m = failure([&] { Dataset::records({lying}).make_iterator().next(); });
  expect_names(m, {lying, "record at offset 0", "claims 1099511627776 bytes", "holds 9 after the header"});
}

// Inside a record: a tensor header claiming 2^40 elements in a 48-byte element.
TEST_F(UntrustedFiles, EncodedTensorClaimingTwoToThe40ElementsFailsBeforeAllocating) {
  std::string bytes;
  auto put = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>(v >> (8 * i));
  };
  put(1);                                   // one component
  put(static_cast<std::uint64_t>(DType::f32));
  put(2);                                   // rank 2
  put(std::uint64_t{1} << 20);
  put(std::uint64_t{1} << 20);
  put(0);                                   // 8 bytes where 4 TiB were announced
  const Tensor record = as_record(bytes);
  expect_names(failure([&] { decode_element(record); }),
               {"tensor at byte 8", "[1048576, 1048576] = 4398046511104 bytes", "only 8 of the 48 remain"});
  bytes.resize(bytes.size() - 24);
  put(std::uint64_t{1} << 63);
  put(4);
  put(0);
  const Tensor overflow = as_record(bytes);
  expect_names(failure([&] { decode_element(overflow); }), {"tensor at byte 8", "overflow"});
}

TEST_F(UntrustedFiles, CsvNonFiniteCellsNameFileLineAndColumnUnlessAllowed) {
  const std::string feature = write("f.csv", "a,b,label\n1,2,0\n3,nan,1\n");
  expect_names(testing::message_of<IoError>([&] {
                 Iterator it = Dataset::csv({feature}, {.label_column = "label"}).make_iterator();
                 while (it.next()) {
                 }
               }),
               {feature + ":3: column 2: 'nan' is not a finite number", "allow_non_finite"});
  const std::string label = write("l.csv", "a,b,label\n1,2,-inf\n");
  expect_names(testing::message_of<IoError>([&] {
                 Dataset::csv({label}, {.label_column = "label"}).make_iterator().next();
               }),
               {label + ":2: column 3: '-inf' is not a finite number"});
  for (const char* cell : {"inf", "-Infinity", "NAN", "nan(0x1)"}) {
    const std::string f = write("c.csv", std::string("a\n") + cell + "\n");
    EXPECT_NE(testing::message_of<IoError>([&] { Dataset::csv({f}).make_iterator().next(); }).find("not a finite"),
              std::string::npos)
        << cell;
  }
  Iterator it = Dataset::csv({feature}, {.label_column = "label", .allow_non_finite = true}).make_iterator();
  it.next();
  EXPECT_TRUE(std::isnan(it.next()->at(0).to_vector()[1]));
}

}  // namespace
}  // namespace dtrain::data
