#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain {

TEST(Tensor, StorageIsAligned) {
  for (std::int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::empty({n});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64, 0u) << n;
  }
}

TEST(Tensor, FromVectorChecksCount) {
  Tensor t = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_THROW(Tensor::from_vector({2, 2}, {1, 2, 3}), InvalidArgument);
}

TEST(Tensor, MoreBytesThanMemoryAddressesIsRefusedNamingTheShape) {
  // 2^62 float32 elements: 2^64 bytes, which a 64-bit byte count wraps to 0.
  const std::int64_t quarter = std::int64_t{1} << 31;
  try {
    Tensor::empty({quarter, quarter});
    FAIL() << "a 2^64-byte tensor was allocated";
  } catch (const dtrain::ResourceExhausted& e) {
    EXPECT_NE(std::string(e.what()).find("float32 tensor of shape [2147483648, 2147483648] holds more bytes than "
                                         "memory can address"),
              std::string::npos)
        << e.what();
  }
  // Within what memory addresses but more than it holds: the bytes named, not a bare
  // std::bad_alloc. (The sanitizers' allocators end the process on such a request.)
#if !DTRAIN_SANITIZED
  try {
    Tensor::empty({std::int64_t{1} << 50});
    FAIL() << "4 PiB were allocated";
  } catch (const dtrain::ResourceExhausted& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory: 4503599627370496 bytes"), std::string::npos) << e.what();
  }
#endif
}

// A string tensor holds one std::string per element: views, copies and records keep them;
// what would read them as numbers or bytes is refused by name.
TEST(Tensor, StringsAreElementsThatViewsAndClonesKeepAndNumbersRefuse) {
  Tensor t = Tensor::from_vector({2, 2}, std::vector<std::string>{"a", "", std::string(1000, 'z'), "d\xC3\xA9"});
  EXPECT_EQ(t.dtype(), DType::string);
  EXPECT_EQ(t.row(1, Shape({2})).data<std::string>()[0], std::string(1000, 'z'));
  EXPECT_EQ(t.slice(1, 2).reshape({2}).data<std::string>()[1], "d\xC3\xA9");
  Tensor copy = t.clone();
  copy.data<std::string>()[0] = "changed";
  EXPECT_EQ(t.data<std::string>()[0], "a");
  EXPECT_EQ(Tensor::zeros({3}, DType::string).data<std::string>()[2], "");
  EXPECT_EQ(t.to_string(2), "Tensor(string, [2, 2], [\"a\", \"\", ...])");
  for (auto* op : {+[](const Tensor& x) { (void)x.raw_data(); }, +[](const Tensor& x) { (void)x.to_vector(); },
                   +[](const Tensor& x) { (void)x.data<float>(); }, +[](const Tensor& x) { (void)x.astype(DType::f32); }}) {
    try {
      op(t);
      ADD_FAILURE() << "a string tensor was read as numbers";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("string"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Tensor::empty({2}, DType::string, Device{DeviceType::cuda, 0}), InvalidArgument);
}

TEST(Tensor, SliceSharesStorageWithoutCopy) {
  Tensor t = Tensor::from_vector({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), Shape({2, 2}));
  EXPECT_TRUE(s.shares_storage_with(t));
  EXPECT_EQ(s.to_vector(), (std::vector<float>{2, 3, 4, 5}));
  s.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[2], 42);
  EXPECT_NE(s.id(), t.id());
  EXPECT_THROW(t.slice(2, 4), InvalidArgument);
  EXPECT_THROW(t.slice(2, 1), InvalidArgument);
  EXPECT_EQ(t.slice(3, 3).numel(), 0);
}

TEST(Tensor, CopiesShareIdentityClonesDoNot) {
  Tensor a = Tensor::full({2}, 1.0f);
  Tensor b = a;
  EXPECT_EQ(a.id(), b.id());
  Tensor c = a.clone();
  EXPECT_NE(a.id(), c.id());
  c.data<float>()[0] = 5;
  EXPECT_EQ(a.data<float>()[0], 1.0f);
}

TEST(Tensor, ReshapeChecksCount) {
  Tensor t = Tensor::zeros({2, 3});
  EXPECT_EQ(t.reshape({6}).shape(), Shape({6}));
  EXPECT_THROW(t.reshape({4}), InvalidArgument);
}

TEST(Tensor, DtypeChecked) {
  Tensor t = Tensor::zeros({2});
  EXPECT_THROW(t.data<std::int32_t>(), InvalidArgument);
  Tensor undefined;
  EXPECT_THROW(undefined.clone(), InvalidArgument);
}

TEST(Tensor, Bfloat16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 1.0f / 256)), 1.0f);
  // Just above halfway rounds up.
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 1.0f / 256 + 1.0f / 4096)), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::infinity()))));
  Tensor t = Tensor::from_vector({3}, {0.5f, -2.0f, 3.140625f});
  Tensor b = t.astype(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.nbytes(), 6u);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{0.5f, -2.0f, 3.140625f}));
}

TEST(Tensor, ItemNeedsOneValue) {
  EXPECT_EQ(Tensor::scalar(3.5f).item(), 3.5f);
  EXPECT_THROW(Tensor::zeros({2}).item(), InvalidArgument);
}

}  // namespace dtrain
