#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/core/error.h"
#include "dtrain/data/datasets.h"
#include "dtrain/data/idx.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

class IdxFiles : public testing::TempDirTest {
 protected:
  static std::string header(unsigned char type, std::vector<std::uint32_t> dims) {
    std::string h = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
    for (auto d : dims)
      for (int s = 24; s >= 0; s -= 8) h += static_cast<char>((d >> s) & 0xff);
    return h;
  }
  std::string write(const std::string& name, const std::string& bytes, bool gzip) {
    if (!gzip) return TempDirTest::write(name, bytes);
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }
  static std::string what(const std::function<void()>& f) { return testing::message_of<IoError>(f); }
};

TEST_F(IdxFiles, ReadsImagesAndLabelsPlainAndGzip) {
  std::string images = header(0x08, {2, 2, 3});
  for (int i = 0; i < 12; ++i) images += static_cast<char>(i * 20);
  std::string labels = header(0x08, {2}) + std::string{7, 3};
  for (bool gz : {false, true}) {
    Tensor x = read_idx_images(write("img", images, gz));
    EXPECT_EQ(x.shape(), Shape({2, 6}));
    EXPECT_FLOAT_EQ(x.to_vector()[11], 220.0f / 255.0f);
    Tensor bytes = read_idx_image_bytes(write("img", images, gz));
    EXPECT_EQ(bytes.dtype(), DType::u8);
    EXPECT_EQ(bytes.shape(), Shape({2, 6}));
    EXPECT_EQ(bytes.data<std::uint8_t>()[11], 220);
    Tensor y = read_idx_labels(write("lab", labels, gz));
    EXPECT_EQ(y.dtype(), DType::i32);
    EXPECT_EQ(y.to_vector(), (std::vector<float>{7, 3}));
  }
}

TEST_F(IdxFiles, ErrorsNameTheFileAndTheProblem) {
  const std::string missing = (dir_ / "nope").string();
  EXPECT_NE(what([&] { read_idx_labels(missing); }).find(missing), std::string::npos);

  const std::string bad_magic = write("magic", std::string{1, 2, 8, 1, 0, 0, 0, 1, 5}, false);
  EXPECT_NE(what([&] { read_idx_labels(bad_magic); }).find("not an IDX file"), std::string::npos);

  const std::string truncated = write("short", header(0x08, {10}) + "abc", true);
  const std::string m = what([&] { read_idx_labels(truncated); });
  EXPECT_NE(m.find(truncated), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  EXPECT_NE(m.find("offset 8"), std::string::npos) << m;

  const std::string floats = write("floats", header(0x0D, {1}) + "abcd", false);
  EXPECT_NE(what([&] { read_idx_labels(floats); }).find("type code"), std::string::npos);

  const std::string rank = write("rank", header(0x08, {1}) + "a", false);
  EXPECT_NE(what([&] { read_idx_images(rank); }).find("expected 3"), std::string::npos);

  const std::string extra = write("extra", header(0x08, {1}) + "ab", false);
  EXPECT_NE(what([&] { read_idx_labels(extra); }).find("past the"), std::string::npos);

  const std::string garbage = write("garbage.gz", std::string("\x1f\x8b\x08\x00garbagegarbage", 18), false);
  EXPECT_NE(what([&] { read_idx_labels(garbage); }).find(garbage), std::string::npos);
}

TEST_F(IdxFiles, FashionMnistDirectoryFromEnvironment) {
  setenv("DTRAIN_FASHION_MNIST_DIR", dir_.c_str(), 1);
  EXPECT_EQ(fashion_mnist_dir(), dir_.string());
  const std::string m = what([] { load_fashion_mnist(); });
  EXPECT_NE(m.find("train-images-idx3-ubyte"), std::string::npos) << m;
  EXPECT_NE(m.find("DTRAIN_FASHION_MNIST_DIR"), std::string::npos) << m;
  unsetenv("DTRAIN_FASHION_MNIST_DIR");
  EXPECT_EQ(fashion_mnist_dir("/x"), "/x");
}

TEST(FashionMnist, LoadsDebiansPackage) {
  const Classification c = load_fashion_mnist();
  EXPECT_EQ(c.train.x.shape(), Shape({60000, 784}));
  EXPECT_EQ(c.test.x.shape(), Shape({10000, 784}));
  EXPECT_EQ(c.train.y.data<std::int32_t>()[0], 9);  // the first training image is an ankle boot
  float lo = 1, hi = 0;
  for (float v : c.test.x.to_vector()) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  // As stored: the same images as bytes, which float32 holds divided by 255.
  const Classification b = load_fashion_mnist("", DType::u8);
  ASSERT_EQ(b.train.x.dtype(), DType::u8);
  EXPECT_EQ(b.train.x.shape(), c.train.x.shape());
  const std::uint8_t* raw = b.test.x.data<std::uint8_t>();
  const float* scaled = c.test.x.data<float>();
  for (std::int64_t i = 0; i < b.test.x.numel(); i += 997) EXPECT_EQ(scaled[i], raw[i] * (1.0f / 255.0f)) << i;
  EXPECT_THROW(load_fashion_mnist("", DType::i32), InvalidArgument);
}

TEST(Synthetic, SeededAndShaped) {
  Split a = make_synthetic(100, 8, 3, 42), b = make_synthetic(100, 8, 3, 42);
  EXPECT_EQ(a.x.shape(), Shape({100, 8}));
  EXPECT_EQ(a.x.to_vector(), b.x.to_vector());
  EXPECT_EQ(a.y.to_vector(), b.y.to_vector());
  for (float v : a.y.to_vector()) EXPECT_TRUE(v >= 0 && v < 3);
  Split t = make_synthetic(100, 8, 3, 42, SyntheticLabels::teacher);
  EXPECT_EQ(t.x.to_vector(), a.x.to_vector());
  EXPECT_THROW(make_synthetic(10, 0, 3, 1), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::data
