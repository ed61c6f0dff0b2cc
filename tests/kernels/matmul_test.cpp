#include <gtest/gtest.h>

#include <cmath>

#include "common/gradcheck.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::kernels {
namespace {

using testing::random_tensor;

// Reference: c = act(op(a) · op(b) + bias), accumulated in double.
std::vector<float> reference(const Tensor& a, const Tensor& b, const MatmulOptions& o, std::int64_t M,
                             std::int64_t K, std::int64_t N) {
  const auto va = a.to_vector(), vb = b.to_vector();
  std::vector<float> bias = o.bias ? o.bias->to_vector() : std::vector<float>(N, 0.0f);
  std::vector<float> c(static_cast<size_t>(M * N));
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = bias[j];
      for (std::int64_t k = 0; k < K; ++k) {
        const float x = o.transpose_a ? va[k * M + i] : va[i * K + k];
        const float y = o.transpose_b ? vb[j * K + k] : vb[k * N + j];
        s += static_cast<double>(x) * y;
      }
      float v = static_cast<float>(s);
      switch (o.activation) {
        case Activation::relu: v = std::max(v, 0.0f); break;
        case Activation::sigmoid: v = 1.0f / (1.0f + std::exp(-v)); break;
        case Activation::tanh: v = std::tanh(v); break;
        case Activation::gelu: v = 0.5f * v * (1.0f + std::erf(v / std::sqrt(2.0f))); break;
        case Activation::linear: break;
      }
      c[i * N + j] = v;
    }
  return c;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << i;
}

struct Case {
  std::int64_t M, K, N;
  bool ta, tb;
};

class MatmulShapes : public ::testing::TestWithParam<Case> {};

// A block of columns: c[:, cols] = op(a) · b[:, cols], the other columns of c untouched;
// with accumulate, added to what c held.
TEST(Matmul, ColumnBlockWritesOnlyItsColumns) {
  const std::int64_t M = 33, K = 70, N = 45, begin = 11, end = 29;
  for (const bool ta : {false, true})
    for (const bool accumulate : {false, true}) {
      Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 1);
      Tensor b = random_tensor({K, N}, 2);
      Tensor c = random_tensor({M, N}, 3);
      const std::vector<float> before = c.to_vector();
      const std::vector<float> full = reference(a, b, {.transpose_a = ta}, M, K, N);
      backend().matmul(a, b, c, {.transpose_a = ta, .accumulate = accumulate, .column_begin = begin, .column_end = end});
      const std::vector<float> got = c.to_vector();
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          const std::size_t at = static_cast<std::size_t>(i * N + j);
          const bool inside = j >= begin && j < end;
          const float want = inside ? full[at] + (accumulate ? before[at] : 0.0f) : before[at];
          ASSERT_NEAR(got[at], want, 1e-4f * (1 + std::fabs(want)))
              << "row " << i << ", column " << j << (ta ? ", a transposed" : "") << (accumulate ? ", accumulating" : "");
        }
    }
}

TEST(Matmul, ColumnBlockOutOfRangeIsAnError) {
  Tensor a = random_tensor({4, 5}, 1), b = random_tensor({5, 6}, 2), c = Tensor::empty({4, 6});
  try {
    backend().matmul(a, b, c, {.column_begin = 2, .column_end = 7});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("columns [2, 7)"), std::string::npos) << e.what();
  }
}

TEST_P(MatmulShapes, MatchesReferenceWithTransposes) {
  const Case c = GetParam();
  Tensor a = random_tensor(c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, 1);
  Tensor b = random_tensor(c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, 2);
  Tensor out = Tensor::empty({c.M, c.N});
  MatmulOptions o{.transpose_a = c.ta, .transpose_b = c.tb};
  backend().matmul(a, b, out, o);
  expect_close(out.to_vector(), reference(a, b, o, c.M, c.K, c.N), 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulShapes,
                         ::testing::Values(Case{1, 1, 1, false, false}, Case{7, 13, 5, false, false},
                                           Case{7, 13, 5, true, false}, Case{7, 13, 5, false, true},
                                           Case{7, 13, 5, true, true}, Case{64, 100, 33, false, false},
                                           Case{3, 0, 4, false, false}),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           const Case& c = param.param;
                           return "M" + std::to_string(c.M) + "K" + std::to_string(c.K) + "N" + std::to_string(c.N) +
                                  (c.ta ? "_ta" : "") + (c.tb ? "_tb" : "");
                         });

TEST(Matmul, FusedBiasAndActivations) {
  Tensor a = random_tensor({9, 6}, 3);
  Tensor b = random_tensor({6, 4}, 4);
  Tensor bias = random_tensor({4}, 5);
  for (Activation act : {Activation::linear, Activation::relu, Activation::sigmoid, Activation::tanh, Activation::gelu}) {
    Tensor out = Tensor::empty({9, 4});
    MatmulOptions o{.bias = &bias, .activation = act};
    backend().matmul(a, b, out, o);
    expect_close(out.to_vector(), reference(a, b, o, 9, 6, 4), 1e-4f);
  }
}

TEST(Matmul, Accumulates) {
  Tensor a = random_tensor({5, 3}, 6);
  Tensor b = random_tensor({3, 2}, 7);
  Tensor out = Tensor::full({5, 2}, 1.5f);
  backend().matmul(a, b, out, {.accumulate = true});
  auto want = reference(a, b, {}, 5, 3, 2);
  for (auto& v : want) v += 1.5f;
  expect_close(out.to_vector(), want, 1e-4f);
}

// An `a` past the bytes one oneDNN call takes (2 GiB; here lowered to a few rows) is
// multiplied in parts, along M as it is stored, along K transposed: the same result.
TEST(Matmul, AnOperandPastTheKernelsOffsetsIsMultipliedInParts) {
  CpuBackend& cpu = cpu_backend();
  const std::int64_t M = 23, K = 31, N = 6;
  cpu.set_matmul_part_bytes(5 * K * 4);  // 5 rows of a [M, K] in float32; 5 rows of 23 of aᵀ
  struct Restore {
    ~Restore() { cpu_backend().set_matmul_part_bytes(std::numeric_limits<std::int32_t>::max()); }
  } restore;
  Tensor bias = random_tensor({N}, 9);
  for (const bool ta : {false, true})
    for (const bool accumulate : {false, true}) {
      Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 10);
      Tensor b = random_tensor({K, N}, 11);
      Tensor c = random_tensor({M, N}, 12);
      const std::vector<float> before = c.to_vector();
      // Stored as is, the parts take a bias and an activation too.
      MatmulOptions o{.transpose_a = ta, .bias = ta || accumulate ? nullptr : &bias,
                      .activation = ta || accumulate ? Activation::linear : Activation::relu, .accumulate = accumulate};
      std::vector<float> want = reference(a, b, o, M, K, N);
      if (accumulate)
        for (std::size_t i = 0; i < want.size(); ++i) want[i] += before[i];
      cpu.matmul(a, b, c, o);
      SCOPED_TRACE(std::string(ta ? "a transposed" : "a as stored") + (accumulate ? ", accumulating" : ""));
      expect_close(c.to_vector(), want, 1e-4f);
    }
  // Transposed, a block of columns (a replica's share of a weight gradient) is split too.
  Tensor a = random_tensor({K, M}, 15), b = random_tensor({K, N}, 16), c = random_tensor({M, N}, 17);
  const std::vector<float> before = c.to_vector(), full = reference(a, b, {.transpose_a = true}, M, K, N);
  cpu.matmul(a, b, c, {.transpose_a = true, .column_begin = 2, .column_end = 5});
  const std::vector<float> got = c.to_vector();
  for (std::int64_t i = 0; i < M * N; ++i) {
    const bool inside = i % N >= 2 && i % N < 5;
    ASSERT_NEAR(got[i], inside ? full[i] : before[i], 1e-4f * (1 + std::fabs(full[i]))) << i;
  }
  // What cannot be split is refused, naming the operand.
  Tensor wide = random_tensor({2, 200}, 13), b3 = random_tensor({200, 3}, 14), c3 = Tensor::empty({2, 3});
  try {
    cpu.matmul(wide, b3, c3, {});
    FAIL() << "expected ResourceExhausted";
  } catch (const ResourceExhausted& e) {
    EXPECT_NE(std::string(e.what()).find("a [2, 200] has rows of more than 620 bytes"), std::string::npos) << e.what();
  }
}

TEST(Matmul, Bfloat16InputsMatchRoundedReference) {
  Tensor a = random_tensor({16, 32}, 8).astype(DType::bf16);
  Tensor b = random_tensor({32, 8}, 9).astype(DType::bf16);
  Tensor out = Tensor::empty({16, 8});
  backend().matmul(a, b, out, {});
  // The reference uses the same bf16-rounded values, so only accumulation order differs.
  expect_close(out.to_vector(), reference(a, b, {}, 16, 32, 8), 1e-3f);
}

TEST(Matmul, ShapeMismatchNamesShapes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5}), c = Tensor::empty({2, 5});
  try {
    backend().matmul(a, b, c, {});
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  }
}

TEST(Matmul, PrimitivesAreCachedByShape) {
  auto& be = cpu_backend();
  Tensor a = random_tensor({11, 12}, 10), b = random_tensor({12, 13}, 11), c = Tensor::empty({11, 13});
  be.matmul(a, b, c, {});
  const auto first = be.cache_stats();
  for (int i = 0; i < 5; ++i) be.matmul(a, b, c, {});
  const auto later = be.cache_stats();
  EXPECT_EQ(later.created, first.created);
  EXPECT_GE(later.hits, first.hits + 5);
}

TEST(Matmul, SameResultWithOneAndTwoThreads) {
  Tensor a = random_tensor({64, 256}, 12), b = random_tensor({256, 128}, 13);
  Tensor c1 = Tensor::empty({64, 128}), c2 = Tensor::empty({64, 128});
  const int saved = num_threads();
  set_num_threads(1);
  backend().matmul(a, b, c1, {});
  set_num_threads(2);
  backend().matmul(a, b, c2, {});
  set_num_threads(saved);
  expect_close(c1.to_vector(), c2.to_vector(), 1e-5f);
}

}  // namespace
}  // namespace dtrain::kernels
