#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/gradcheck.h"
#include "dtrain/kernels/backend.h"

namespace dtrain::kernels {
namespace {

using testing::random_tensor;

TEST(Unary, MatchesStdFunctions) {
  Tensor x = random_tensor({1000}, 1, 0.1f, 3.0f);
  const auto v = x.to_vector();
  struct UnaryCase {
    Unary op;
    std::function<float(float)> f;
  };
  const UnaryCase cases[] = {
      {Unary::relu, [](float a) { return std::max(a, 0.0f); }},
      {Unary::sigmoid, [](float a) { return 1.0f / (1.0f + std::exp(-a)); }},
      {Unary::tanh, [](float a) { return std::tanh(a); }},
      {Unary::gelu, [](float a) { return 0.5f * a * (1.0f + std::erf(a / std::sqrt(2.0f))); }},
      {Unary::exp, [](float a) { return std::exp(a); }},
      {Unary::log, [](float a) { return std::log(a); }},
      {Unary::square, [](float a) { return a * a; }},
      {Unary::sqrt, [](float a) { return std::sqrt(a); }},
      {Unary::abs, [](float a) { return std::fabs(a); }},
  };
  for (const auto& c : cases) {
    Tensor y = Tensor::empty(x.shape());
    backend().unary(c.op, x, y);
    const auto got = y.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_NEAR(got[i], c.f(v[i]), 1e-5f * (1 + std::fabs(c.f(v[i])))) << static_cast<int>(c.op) << " at " << v[i];
  }
}

TEST(Unary, LinearAndClipTakeParameters) {
  Tensor x = Tensor::from_vector({4}, {-2, -0.5f, 0.5f, 2});
  Tensor y = Tensor::empty({4});
  backend().unary(Unary::linear, x, y, 3.0f, 1.0f);
  EXPECT_EQ(y.to_vector(), (std::vector<float>{-5, -0.5f, 2.5f, 7}));
  backend().unary(Unary::clip, x, y, -1.0f, 1.0f);
  EXPECT_EQ(y.to_vector(), (std::vector<float>{-1, -0.5f, 0.5f, 1}));
}

// c = a op b with NumPy broadcasting, by index arithmetic.
std::vector<float> reference_binary(Binary op, const Tensor& a, const Tensor& b, const Shape& out) {
  const auto va = a.to_vector(), vb = b.to_vector();
  std::vector<float> c(static_cast<size_t>(out.numel()));
  const auto so = out.strides();
  for (std::int64_t k = 0; k < out.numel(); ++k) {
    std::int64_t ia = 0, ib = 0, sa = 1, sb = 1;
    for (int d = out.rank() - 1; d >= 0; --d) {
      const std::int64_t idx = (k / so[d]) % out[d];
      const int da = a.rank() - out.rank() + d, db = b.rank() - out.rank() + d;
      if (da >= 0) { ia += (a.dim(da) == 1 ? 0 : idx) * sa; sa *= a.dim(da); }
      if (db >= 0) { ib += (b.dim(db) == 1 ? 0 : idx) * sb; sb *= b.dim(db); }
    }
    const float x = va[ia], y = vb[ib];
    switch (op) {
      case Binary::add: c[k] = x + y; break;
      case Binary::sub: c[k] = x - y; break;
      case Binary::mul: c[k] = x * y; break;
      case Binary::div: c[k] = x / y; break;
      case Binary::max: c[k] = std::max(x, y); break;
      case Binary::min: c[k] = std::min(x, y); break;
    }
  }
  return c;
}

TEST(Binary, BroadcastsEitherOperand) {
  const std::pair<Shape, Shape> shapes[] = {
      {{4, 3}, {4, 3}}, {{4, 3}, {3}}, {{4, 3}, {4, 1}}, {{3}, {4, 3}}, {{4, 1}, {1, 5}}, {{2, 1, 3}, {4, 1}}, {{}, {2, 2}},
  };
  for (const auto& [sa, sb] : shapes) {
    Tensor a = random_tensor(sa, 1, 0.5f, 2.0f), b = random_tensor(sb, 2, 0.5f, 2.0f);
    const Shape out = broadcast_shapes(sa, sb, "test");
    for (Binary op : {Binary::add, Binary::sub, Binary::mul, Binary::div, Binary::max, Binary::min}) {
      Tensor c = Tensor::empty(out);
      backend().binary(op, a, b, c);
      const auto want = reference_binary(op, a, b, out);
      const auto got = c.to_vector();
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6f) << sa.to_string() << " op " << static_cast<int>(op) << " " << sb.to_string();
    }
  }
}

TEST(Binary, WrongOutputShapeIsAnError) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3}), c = Tensor::empty({3, 2});
  EXPECT_THROW(backend().binary(Binary::add, a, b, c), InvalidArgument);
}

TEST(Reduce, SumMeanMaxOverAxes) {
  Tensor x = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor rows = Tensor::empty({2, 1}), cols = Tensor::empty({3}), all = Tensor::empty({});
  backend().reduce(Reduce::sum, x, rows);
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{6, 15}));
  backend().reduce(Reduce::sum, x, cols);
  EXPECT_EQ(cols.to_vector(), (std::vector<float>{5, 7, 9}));
  backend().reduce(Reduce::mean, x, all);
  EXPECT_FLOAT_EQ(all.item(), 3.5f);
  backend().reduce(Reduce::max, x, cols);
  EXPECT_EQ(cols.to_vector(), (std::vector<float>{4, 5, 6}));
  Tensor bad = Tensor::empty({2});
  EXPECT_THROW(backend().reduce(Reduce::sum, x, bad), InvalidArgument);
}

// Every layout: leading axes (loop path), trailing axes (loop path), a middle axis and
// mixed axes (oneDNN path), for sum, mean and max, against a naive reference.
TEST(Reduce, AllLayoutsMatchNaive) {
  const Shape x_shape{3, 4, 5};
  Tensor x = testing::random_tensor(x_shape, 7);
  const auto v = x.to_vector();
  const Shape outs[] = {{1, 4, 5}, {1, 1, 5}, {3, 1, 1}, {3, 4, 1}, {3, 1, 5}, {1, 4, 1}, {1, 1, 1}, {4, 5}, {5}};
  for (const Shape& o : outs) {
    for (Reduce op : {Reduce::sum, Reduce::mean, Reduce::max}) {
      Tensor y = Tensor::empty(o);
      backend().reduce(op, x, y);
      // Naive: o padded to rank 3.
      std::int64_t d[3];
      for (int i = 0; i < 3; ++i) d[i] = i - (3 - o.rank()) >= 0 ? o[i - (3 - o.rank())] : 1;
      std::vector<double> acc(static_cast<size_t>(o.numel()), op == Reduce::max ? -1e30 : 0.0);
      std::vector<int> count(acc.size(), 0);
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 4; ++b)
          for (int c = 0; c < 5; ++c) {
            const std::int64_t k = ((d[0] == 1 ? 0 : a) * d[1] + (d[1] == 1 ? 0 : b)) * d[2] + (d[2] == 1 ? 0 : c);
            const double val = v[(a * 4 + b) * 5 + c];
            acc[k] = op == Reduce::max ? std::max(acc[k], val) : acc[k] + val;
            ++count[k];
          }
      const auto got = y.to_vector();
      for (size_t k = 0; k < acc.size(); ++k) {
        const double want = op == Reduce::mean ? acc[k] / count[k] : acc[k];
        ASSERT_NEAR(got[k], want, 1e-5) << o.to_string() << " op " << static_cast<int>(op) << " at " << k;
      }
    }
  }
}

TEST(Softmax, RowsSumToOneAndLogMatches) {
  Tensor x = Tensor::from_vector({2, 3}, {1, 2, 3, 1000, 1000, 1000});  // the second row would overflow naively
  Tensor y = Tensor::empty({2, 3}), ly = Tensor::empty({2, 3});
  backend().softmax(x, y, false);
  backend().softmax(x, ly, true);
  const auto v = y.to_vector(), lv = ly.to_vector();
  const float e = std::exp(1.0f), z = e + e * e + e * e * e;
  EXPECT_NEAR(v[0], e / z, 1e-6);
  EXPECT_NEAR(v[4], 1.0f / 3, 1e-6);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(std::exp(lv[i]), v[i], 1e-5);  // oneDNN's exp and log are within a few ulp
}

TEST(Axpby, ScalesAndAdds) {
  Tensor x = Tensor::from_vector({3}, {1, 2, 3});
  Tensor y = Tensor::from_vector({3}, {10, 20, 30});
  backend().axpby(2.0f, x, 0.5f, y);
  EXPECT_EQ(y.to_vector(), (std::vector<float>{7, 14, 21}));
  Tensor nan = Tensor::full({3}, std::nanf(""));
  backend().axpby(1.0f, x, 0.0f, nan);  // beta = 0 ignores old values, even NaN
  EXPECT_EQ(nan.to_vector(), (std::vector<float>{1, 2, 3}));
}

TEST(SumSquares, LargeTensorInDouble) {
  Tensor x = Tensor::full({1 << 20}, 0.5f);
  EXPECT_DOUBLE_EQ(backend().sum_squares(x), 0.25 * (1 << 20));
}

TEST(Convert, RoundTripsBfloat16) {
  Tensor x = Tensor::from_vector({4}, {1.0f, 1.0f + 1.0f / 256, -3.5f, 100.25f});
  Tensor b = Tensor::empty({4}, DType::bf16);
  backend().convert(x, b);
  EXPECT_EQ(b.to_vector(), x.astype(DType::bf16).to_vector());
}

}  // namespace
}  // namespace dtrain::kernels
