// One description of each primitive, run on every backend this machine has: each backend's
// result against a reference computed here in double precision and, on a GPU, against the
// CPU backend's on the same inputs. The shapes include the adversarial ones: an empty batch,
// one row, odd sizes, rows longer than a block of threads. Tolerances are written beside
// each op with their reason. On a machine without a GPU the CUDA instance skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/error_message.h"
#include "common/gradcheck.h"
#include "dtrain/core/rng.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/element_math.h"

namespace dtrain::kernels {
namespace {

using testing::random_tensor;

struct BackendCase {
  const char* name;
  Device device;
};

class Conformance : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    if (!device().is_cpu() && device_count(DeviceType::cuda) == 0)
      GTEST_SKIP() << "the CUDA backend has no GPU to run on: " << describe_devices(DeviceType::cuda);
  }
  Device device() const { return GetParam().device; }
  bool gpu() const { return !device().is_cpu(); }
  Backend& be() { return backend(device()); }
  // A host tensor's copy on the backend's device.
  Tensor on(const Tensor& host) const { return host.to(device()); }
  Tensor out(const Shape& shape, DType dtype = DType::f32) const { return Tensor::empty(shape, dtype, device()); }
};

// |got - want| <= atol + rtol * |want| for every element, where want is the reference.
void expect_near(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: " << got[i] << ", want NaN";
      continue;
    }
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " [" << i << "]";
      continue;
    }
    ASSERT_LE(std::fabs(got[i] - want[i]), atol + rtol * std::fabs(want[i]))
        << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
  }
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// On a GPU, the same call on the CPU backend: the two backends' results agree within
// `rtol` of each value plus `atol` (float32 everywhere: 1e-5 relative, as documented).
void expect_same_as_cpu(const Tensor& got, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  expect_near(got.to_vector(), as_double(cpu.to_vector()), rtol, atol, what + " (against the CPU backend)");
}

// ---- matmul

std::vector<double> matmul_reference(const Tensor& a, const Tensor& b, const MatmulOptions& o, std::int64_t M,
                                     std::int64_t K, std::int64_t N) {
  const auto va = a.to_vector(), vb = b.to_vector();
  const std::vector<float> bias = o.bias ? o.bias->to_vector() : std::vector<float>(static_cast<std::size_t>(N), 0.0f);
  std::vector<double> c(static_cast<std::size_t>(M * N));
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = bias[static_cast<std::size_t>(j)];
      for (std::int64_t k = 0; k < K; ++k)
        s += static_cast<double>(o.transpose_a ? va[k * M + i] : va[i * K + k]) *
             (o.transpose_b ? vb[j * K + k] : vb[k * N + j]);
      switch (o.activation) {
        case Activation::relu: s = std::max(s, 0.0); break;
        case Activation::sigmoid: s = 1.0 / (1.0 + std::exp(-s)); break;
        case Activation::tanh: s = std::tanh(s); break;
        case Activation::gelu: s = 0.5 * s * (1.0 + std::erf(s / std::sqrt(2.0))); break;
        case Activation::linear: break;
      }
      c[static_cast<std::size_t>(i * N + j)] = s;
    }
  return c;
}

TEST_P(Conformance, MatmulMatchesDoubleReference) {
  struct Case {
    std::int64_t m, k, n;
  };
  // Float32 sums of K products: each within K * 2^-24 of exact, in practice far less.
  for (const Case s : {Case{1, 1, 1}, Case{0, 5, 3}, Case{4, 0, 3}, Case{7, 13, 5}, Case{33, 70, 45},
                       Case{64, 1024, 129}, Case{5, 3000, 2}})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const Activation act : {Activation::linear, Activation::relu, Activation::sigmoid, Activation::gelu}) {
          const Tensor a = random_tensor(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, 1);
          const Tensor b = random_tensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, 2);
          const Tensor bias = random_tensor({s.n}, 3);
          const Tensor da = on(a), db = on(b), dbias = on(bias);
          Tensor c = out({s.m, s.n});
          MatmulOptions o{.transpose_a = ta, .transpose_b = tb, .bias = &dbias, .activation = act};
          be().matmul(da, db, c, o);
          MatmulOptions ho = o;
          ho.bias = &bias;
          const std::string what = "matmul " + std::to_string(s.m) + "x" + std::to_string(s.k) + "x" +
                                   std::to_string(s.n) + (ta ? " ta" : "") + (tb ? " tb" : "") + " act " +
                                   std::to_string(static_cast<int>(act));
          expect_near(c.to_vector(), matmul_reference(a, b, ho, s.m, s.k, s.n), 2e-5, 2e-5 * std::sqrt(double(s.k)),
                      what);
          if (gpu()) {
            Tensor cc = Tensor::empty({s.m, s.n});
            backend().matmul(a, b, cc, ho);
            expect_same_as_cpu(c, cc, 1e-5, 1e-5 * std::sqrt(double(s.k)), what);
          }
        }
}

TEST_P(Conformance, MatmulAccumulatesAndWritesColumnBlocks) {
  const std::int64_t M = 17, K = 40, N = 23, begin = 5, end = 19;
  const Tensor a = random_tensor({M, K}, 4), b = random_tensor({K, N}, 5), c0 = random_tensor({M, N}, 6);
  std::vector<double> want = as_double(c0.to_vector());
  Tensor c = on(c0.clone());
  be().matmul(on(a), on(b), c, {.accumulate = true, .column_begin = begin, .column_end = end});
  const std::vector<double> full = matmul_reference(a, b, {}, M, K, N);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = begin; j < end; ++j) want[static_cast<std::size_t>(i * N + j)] += full[static_cast<std::size_t>(i * N + j)];
  expect_near(c.to_vector(), want, 2e-5, 1e-4, "matmul accumulated into columns [5, 19)");
}

// bfloat16 and float16 operands: exact products of the rounded values, summed in float32;
// the reference rounds the inputs the same way, so only the summation differs.
TEST_P(Conformance, MatmulIn16BitsRoundsTheOperandsOnly) {
  const std::int64_t M = 31, K = 257, N = 19;
  const Tensor a = random_tensor({M, K}, 7), b = random_tensor({K, N}, 8);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Tensor a16 = a.astype(dtype), b16 = b.astype(dtype);
    Tensor c = out({M, N});
    be().matmul(on(a16), on(b16), c, {});
    expect_near(c.to_vector(), matmul_reference(a16.astype(DType::f32), b16.astype(DType::f32), {}, M, K, N), 1e-5,
                1e-4, std::string(dtype_name(dtype)) + " matmul");
  }
}

// ---- element-wise

double unary_reference(Unary op, double x, double alpha, double beta) {
  switch (op) {
    case Unary::linear: return alpha * x + beta;
    case Unary::relu: return x > 0 ? x : 0;
    case Unary::sigmoid: return 1 / (1 + std::exp(-x));
    case Unary::tanh: return std::tanh(x);
    case Unary::gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Unary::exp: return std::exp(x);
    case Unary::log: return std::log(x);
    case Unary::square: return x * x;
    case Unary::sqrt: return std::sqrt(x);
    case Unary::abs: return std::fabs(x);
    case Unary::clip: return std::min(std::max(x, alpha), beta);
    case Unary::gelu_tanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  return 0;
}

double unary_derivative(Unary op, double x, double alpha, double beta) {
  switch (op) {
    case Unary::linear: return alpha;
    case Unary::relu: return x > 0 ? 1 : 0;
    case Unary::sigmoid: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 - s);
    }
    case Unary::tanh: return 1 - std::tanh(x) * std::tanh(x);
    case Unary::gelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case Unary::exp: return std::exp(x);
    case Unary::log: return 1 / x;
    case Unary::square: return 2 * x;
    case Unary::sqrt: return 0.5 / std::sqrt(x);
    case Unary::abs: return x > 0 ? 1 : -1;
    case Unary::clip: return x > alpha && x < beta ? 1 : 0;
    case Unary::gelu_tanh: {
      const double c = std::sqrt(2 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
  }
  return 0;
}

// What unary_backward reads for each op: the output or the input (backend.h).
bool reads_output(Unary op) {
  return op == Unary::relu || op == Unary::sigmoid || op == Unary::tanh || op == Unary::exp || op == Unary::sqrt;
}

TEST_P(Conformance, UnaryFunctionsAndTheirDerivatives) {
  // Transcendentals in float32 differ between math libraries by a few ulp: 1e-5 relative;
  // oneDNN's gelu_erf is a polynomial within 5e-5, and its log within 5e-6 absolute.
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{100003}})
    for (int k = 0; k <= static_cast<int>(Unary::gelu_tanh); ++k) {
      const auto op = static_cast<Unary>(k);
      const bool positive = op == Unary::log || op == Unary::sqrt;
      const Tensor x = testing::random_away_from({n}, 10 + k, positive ? 0.05f : -4.0f, 4.0f, {0.0f, -0.5f, 0.5f});
      const float alpha = op == Unary::clip ? -0.5f : (op == Unary::linear ? 1.5f : 1.0f);
      const float beta = op == Unary::clip ? 0.5f : (op == Unary::linear ? -0.25f : 0.0f);
      Tensor y = out({n});
      be().unary(op, on(x), y, alpha, beta);
      const std::vector<float> xv = x.to_vector();
      std::vector<double> want(xv.size()), dwant(xv.size());
      for (std::size_t i = 0; i < xv.size(); ++i) {
        want[i] = unary_reference(op, xv[i], alpha, beta);
        dwant[i] = 0.75 * unary_derivative(op, xv[i], alpha, beta);
      }
      const std::string what = "unary " + std::to_string(k) + " on " + std::to_string(n);
      expect_near(y.to_vector(), want, op == Unary::gelu || op == Unary::gelu_tanh ? 5e-5 : 1e-5,
                  op == Unary::log ? 5e-6 : 1e-6, what);
      const Tensor saved = reads_output(op) ? y : on(x);
      Tensor dx = out({n});
      be().unary_backward(op, saved, on(Tensor::full({n}, 0.75f)), dx, alpha, beta);
      expect_near(dx.to_vector(), dwant, 2e-5, 1e-6, what + " backward");
    }
}

TEST_P(Conformance, UnaryLinearReadsBytesAndWorksInPlace) {
  Tensor bytes = Tensor::empty({300}, DType::u8);
  for (int i = 0; i < 300; ++i) bytes.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i * 7);
  Tensor y = out({300});
  be().unary(Unary::linear, on(bytes), y, 1.0f / 255.0f, 0.0f);
  std::vector<double> want(300);
  for (int i = 0; i < 300; ++i) want[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 7) / 255.0;
  expect_near(y.to_vector(), want, 1e-6, 0, "linear from bytes");
  be().unary(Unary::square, y, y, 1.0f, 0.0f);  // in place
  for (double& w : want) w *= w;
  expect_near(y.to_vector(), want, 1e-6, 0, "square in place");
}

double binary_reference(Binary op, double a, double b) {
  switch (op) {
    case Binary::add: return a + b;
    case Binary::sub: return a - b;
    case Binary::mul: return a * b;
    case Binary::div: return a / b;
    case Binary::max: return std::max(a, b);
    case Binary::min: return std::min(a, b);
  }
  return 0;
}

TEST_P(Conformance, BinaryOpsBroadcastEitherOperand) {
  struct Case {
    Shape a, b;
  };
  for (const Case& s : {Case{{4, 5}, {4, 5}}, Case{{4, 5}, {5}}, Case{{5}, {4, 5}}, Case{{4, 1}, {1, 5}},
                        Case{{3, 1, 5}, {4, 1}}, Case{{2, 3}, {}}, Case{{0, 3}, {3}}, Case{{7, 1, 1, 3}, {2, 5, 1}}})
    for (int k = 0; k <= static_cast<int>(Binary::min); ++k) {
      const auto op = static_cast<Binary>(k);
      const Tensor a = random_tensor(s.a, 20), b = testing::random_away_from(s.b, 21, -2.0f, 2.0f, {0.0f}, 0.1f);
      const Shape c_shape = broadcast_shapes(s.a, s.b, "test");
      Tensor c = out(c_shape);
      be().binary(op, on(a), on(b), c);
      // The reference broadcasts by index arithmetic.
      const auto av = a.to_vector(), bv = b.to_vector();
      std::vector<double> want(static_cast<std::size_t>(c_shape.numel()));
      const auto strides = c_shape.strides();
      for (std::int64_t i = 0; i < c_shape.numel(); ++i) {
        std::int64_t ia = 0, ib = 0, sa = 1, sb = 1;
        for (int d = c_shape.rank() - 1; d >= 0; --d) {
          const std::int64_t idx = i / strides[d] % c_shape[d];
          const int da = s.a.rank() - c_shape.rank() + d, db = s.b.rank() - c_shape.rank() + d;
          if (da >= 0) {
            ia += (s.a[da] == 1 ? 0 : idx) * sa;
            sa *= s.a[da];
          }
          if (db >= 0) {
            ib += (s.b[db] == 1 ? 0 : idx) * sb;
            sb *= s.b[db];
          }
        }
        want[static_cast<std::size_t>(i)] = binary_reference(op, av[static_cast<std::size_t>(ia)], bv[static_cast<std::size_t>(ib)]);
      }
      expect_near(c.to_vector(), want, 1e-6, 1e-7,
                  "binary " + std::to_string(k) + " " + s.a.to_string() + " with " + s.b.to_string());
    }
}

TEST_P(Conformance, ReductionsOverAnyAxes) {
  const Shape x_shape{6, 7, 9};
  const Tensor x = random_tensor(x_shape, 30);
  const auto xv = x.to_vector();
  for (int mask = 1; mask < 8; ++mask)
    for (int k = 0; k <= static_cast<int>(Reduce::max); ++k) {
      const auto op = static_cast<Reduce>(k);
      Shape y_shape = x_shape;
      for (int d = 0; d < 3; ++d)
        if (mask & (1 << d)) y_shape.set(d, 1);
      Tensor y = out(y_shape);
      be().reduce(op, on(x), y);
      std::vector<double> want(static_cast<std::size_t>(y_shape.numel()), op == Reduce::max ? -INFINITY : 0.0);
      std::vector<int> count(want.size(), 0);
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 7; ++j)
          for (int l = 0; l < 9; ++l) {
            const int o = ((mask & 1) ? 0 : i) * static_cast<int>(y_shape[1] * y_shape[2]) +
                          ((mask & 2) ? 0 : j) * static_cast<int>(y_shape[2]) + ((mask & 4) ? 0 : l);
            const double v = xv[static_cast<std::size_t>((i * 7 + j) * 9 + l)];
            want[static_cast<std::size_t>(o)] = op == Reduce::max ? std::max(want[static_cast<std::size_t>(o)], v)
                                                                  : want[static_cast<std::size_t>(o)] + v;
            ++count[static_cast<std::size_t>(o)];
          }
      if (op == Reduce::mean)
        for (std::size_t o = 0; o < want.size(); ++o) want[o] /= count[o];
      expect_near(y.to_vector(), want, 1e-5, 1e-6, "reduce " + std::to_string(k) + " axes " + std::to_string(mask));
    }
  // A reduction with many values per output, and an empty input.
  const Tensor big = random_tensor({3, 50001}, 31);
  Tensor sums = out({3, 1});
  be().reduce(Reduce::sum, on(big), sums);
  const auto bv = big.to_vector();
  std::vector<double> want(3, 0.0);
  for (std::size_t i = 0; i < bv.size(); ++i) want[i / 50001] += bv[i];
  expect_near(sums.to_vector(), want, 1e-5, 1e-3, "row sums of 50001");
  Tensor empty_max = out({1});
  be().reduce(Reduce::max, on(Tensor::empty({0})), empty_max);
  EXPECT_EQ(empty_max.to_vector()[0], -std::numeric_limits<float>::infinity());
}

TEST_P(Conformance, SoftmaxAndLogSoftmaxWithTheirBackward) {
  for (const Shape& s : {Shape{0, 5}, Shape{1, 1}, Shape{37, 10}, Shape{4, 1000}, Shape{3, 5000}})
    for (const bool log : {false, true}) {
      const Tensor x = random_tensor(s, 40, -6.0f, 6.0f), dy = random_tensor(s, 41);
      Tensor y = out(s), dx = out(s);
      be().softmax(on(x), y, log);
      be().softmax_backward(y, on(dy), dx, log);
      const std::int64_t rows = s[0], cols = s[1];
      const auto xv = x.to_vector(), gv = dy.to_vector();
      std::vector<double> want(xv.size()), dwant(xv.size());
      for (std::int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, sum = 0, dot = 0, gsum = 0;
        for (std::int64_t c = 0; c < cols; ++c) mx = std::max(mx, double(xv[r * cols + c]));
        for (std::int64_t c = 0; c < cols; ++c) sum += std::exp(xv[r * cols + c] - mx);
        for (std::int64_t c = 0; c < cols; ++c) {
          const double p = std::exp(xv[r * cols + c] - mx) / sum;
          want[r * cols + c] = log ? xv[r * cols + c] - mx - std::log(sum) : p;
          dot += gv[r * cols + c] * p;
          gsum += gv[r * cols + c];
        }
        for (std::int64_t c = 0; c < cols; ++c) {
          const double p = std::exp(xv[r * cols + c] - mx) / sum;
          dwant[r * cols + c] = log ? gv[r * cols + c] - p * gsum : p * (gv[r * cols + c] - dot);
        }
      }
      const std::string what = std::string(log ? "log_softmax " : "softmax ") + s.to_string();
      // oneDNN's log is within a few 1e-6 absolute of a log-probability near 0.
      expect_near(y.to_vector(), want, 2e-6, 5e-6, what);
      expect_near(dx.to_vector(), dwant, 2e-5, 2e-6, what + " backward");
    }
}

TEST_P(Conformance, SoftmaxCrossEntropySparseAndDenseWithBackward) {
  for (const Shape& s : {Shape{0, 4}, Shape{1, 3}, Shape{64, 10}, Shape{5, 2000}})
    for (const bool sparse : {true, false}) {
      const std::int64_t rows = s[0], cols = s[1];
      const Tensor logits = random_tensor(s, 50, -5.0f, 5.0f);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
      Generator g(51);
      for (auto& l : labels) l = static_cast<std::int32_t>(g.below(static_cast<std::uint64_t>(cols)));
      Tensor dist = random_tensor(s, 52, 0.0f, 1.0f);
      const Tensor target = sparse ? Tensor::from_vector({rows}, labels) : dist;
      Tensor loss = out({rows}), lp = out(s), dlogits = out(s);
      be().softmax_cross_entropy(on(logits), on(target), loss, lp);
      const Tensor dloss = random_tensor({rows}, 53);
      be().softmax_cross_entropy_backward(lp, on(target), on(dloss), dlogits);
      const auto xv = logits.to_vector(), tv = dist.to_vector(), dl = dloss.to_vector();
      std::vector<double> want(static_cast<std::size_t>(rows)), dwant(xv.size());
      for (std::int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, sum = 0, total = 0;
        for (std::int64_t c = 0; c < cols; ++c) mx = std::max(mx, double(xv[r * cols + c]));
        for (std::int64_t c = 0; c < cols; ++c) sum += std::exp(xv[r * cols + c] - mx);
        const double lse = mx + std::log(sum);
        for (std::int64_t c = 0; c < cols; ++c) {
          const double t = sparse ? (c == labels[static_cast<std::size_t>(r)]) : tv[r * cols + c];
          want[static_cast<std::size_t>(r)] -= t * (xv[r * cols + c] - lse);
          total += t;
        }
        for (std::int64_t c = 0; c < cols; ++c) {
          const double t = sparse ? (c == labels[static_cast<std::size_t>(r)]) : tv[r * cols + c];
          dwant[r * cols + c] = dl[static_cast<std::size_t>(r)] * (std::exp(xv[r * cols + c] - lse) * total - t);
        }
      }
      const std::string what = std::string(sparse ? "sparse" : "dense") + " cross-entropy " + s.to_string();
      expect_near(loss.to_vector(), want, 1e-5, 1e-5, what);
      expect_near(dlogits.to_vector(), dwant, 1e-5, 1e-6, what + " backward");
    }
}

// A label outside [0, classes) is an error naming it and its row; on a GPU it is found by the
// kernel and told at the backend's next call.
TEST_P(Conformance, ALabelOutOfRangeIsNamed) {
  Tensor loss = out({3}), lp = out({3, 4});
  const Tensor labels = Tensor::from_vector({3}, std::vector<std::int32_t>{1, 7, 0});
  const auto fail = [&] {
    be().softmax_cross_entropy(on(random_tensor({3, 4}, 1)), on(labels), loss, lp);
    be().synchronize();
    be().fill(loss, 0.0f);
  };
  try {
    fail();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("label 7 at row 1"), std::string::npos) << m;
  }
  be().fill(loss, 0.0f);  // the backend works on after it
  be().synchronize();
}

TEST_P(Conformance, ConversionsToAndFromBfloat16RoundToNearestEven) {
  const std::vector<float> special{0.0f, -0.0f, 1.0f, 1.00390625f /* a tie: rounds to 1 */, 1.01171875f /* tie up */,
                                   std::numeric_limits<float>::infinity(), -3e38f, 1e-40f,
                                   std::numeric_limits<float>::quiet_NaN()};
  Tensor x = Tensor::from_vector({static_cast<std::int64_t>(special.size())}, special);
  Tensor h = out(x.shape(), DType::bf16), back = out(x.shape());
  be().convert(on(x), h);
  be().convert(h, back);
  const auto got = back.to_vector();
  for (std::size_t i = 0; i < special.size(); ++i) {
    const float want = math::from_bf16(math::to_bf16(special[i]));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got[i]));
    else EXPECT_EQ(got[i], want) << special[i];
  }
  EXPECT_EQ(got[3], 1.0f);
  EXPECT_EQ(got[4], 1.015625f);
}

TEST_P(Conformance, ConversionsToAndFromFloat16RoundToNearestEven) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special{0.0f, -0.0f, 1.0f, 1.00048828125f /* 1 + 2^-11, a tie: to 1 */,
                                   1.00146484375f /* 1 + 3 * 2^-11, a tie: up */, 65504.0f, 65519.0f, 65520.0f /* to inf */,
                                   -1e6f, inf, 0x1p-24f /* the smallest subnormal */, 0x1p-25f /* a tie: to 0 */,
                                   0x1.8p-25f /* up to 2^-24 */, 1e-8f, 6.1e-5f,
                                   std::numeric_limits<float>::quiet_NaN()};
  Tensor x = Tensor::from_vector({static_cast<std::int64_t>(special.size())}, special);
  Tensor h = out(x.shape(), DType::f16), back = out(x.shape());
  be().convert(on(x), h);
  be().convert(h, back);
  const auto got = back.to_vector();
  for (std::size_t i = 0; i < special.size(); ++i) {
    const float want = from_f16(to_f16(special[i]));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got[i]));
    else EXPECT_EQ(got[i], want) << special[i];
  }
  EXPECT_EQ(got[3], 1.0f);
  EXPECT_EQ(got[4], 1.001953125f);
  EXPECT_EQ(got[6], 65504.0f);
  EXPECT_EQ(got[7], inf);
  EXPECT_EQ(got[8], -inf);
  EXPECT_EQ(got[10], 0x1p-24f);
  EXPECT_EQ(got[11], 0.0f);
  EXPECT_EQ(got[12], 0x1p-24f);
  EXPECT_EQ(got[13], 0.0f);  // a gradient this small is lost in float16: why loss scaling exists
  // Through an odd length, past the vector loops' widths.
  const Tensor r = random_tensor({1001}, 61);
  Tensor rh = out(r.shape(), DType::f16), rb = out(r.shape());
  be().convert(on(r), rh);
  be().convert(rh, rb);
  EXPECT_EQ(rb.to_vector(), r.astype(DType::f16).astype(DType::f32).to_vector());
}

// A loss scale's check of a step's gradients: every element of every tensor, NaN and
// infinities of either sign, in the last element of a long tensor and among more tensors
// than one GPU launch takes.
TEST_P(Conformance, AllFiniteFindsANanOrAnInfinityAnywhere) {
  std::vector<Tensor> tensors;
  for (std::int64_t i = 0; i < 40; ++i) tensors.push_back(on(random_tensor({i == 7 ? 70001 : (i * 13) % 50}, 70 + i)));
  std::vector<const Tensor*> all;
  for (const Tensor& t : tensors) all.push_back(&t);
  EXPECT_TRUE(be().all_finite(all));
  EXPECT_TRUE(be().all_finite({}));
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (const float value : bad)
    for (const auto& [t, at] : std::vector<std::pair<std::size_t, std::int64_t>>{{7, 70000}, {7, 0}, {39, 6}, {33, 0}}) {
      std::vector<float> v = tensors[t].to_vector();
      const std::vector<float> kept = v;
      v[static_cast<std::size_t>(at)] = value;
      tensors[t].copy_from(Tensor::from_vector(tensors[t].shape(), v));
      EXPECT_FALSE(be().all_finite(all)) << value << " in tensor " << t << " at " << at;
      tensors[t].copy_from(Tensor::from_vector(tensors[t].shape(), kept));
    }
  EXPECT_TRUE(be().all_finite(all));
  // Large finite values are finite (a sum of squares would overflow here).
  const Tensor huge = on(Tensor::full({100}, 3e38f));
  const Tensor* one[] = {&huge};
  EXPECT_TRUE(be().all_finite(one));
}

// A loss scale's check left to the device (a GPU's): the many-variable updates queued
// behind a failed check write nothing, behind a passed one they update; the CPU checks at
// once instead (all_finite) and says so.
TEST_P(Conformance, AFiniteCheckLeftToTheDeviceSkipsTheUpdatesBehindIt) {
  const int count = 40;  // two groups on a GPU
  std::vector<Tensor> w, g, m, v;
  std::vector<UpdateItem> items;
  for (int i = 0; i < count; ++i) {
    const std::int64_t n = 1 + (i * 613) % 2000;
    const auto seed = static_cast<std::uint64_t>(900 + 4 * i);
    w.push_back(on(random_tensor({n}, seed)));
    g.push_back(on(random_tensor({n}, seed + 1)));
    m.push_back(on(random_tensor({n}, seed + 2)));
    v.push_back(on(random_tensor({n}, seed + 3, 0.0f, 1.0f)));
  }
  for (int i = 0; i < count; ++i) items.push_back({&w[i], &g[i], &m[i], &v[i], 1.0f, nullptr});
  std::vector<const Tensor*> grads;
  for (const Tensor& t : g) grads.push_back(&t);
  if (!be().begin_finite_check(grads)) {
    EXPECT_TRUE(be().device().is_cpu());
    EXPECT_TRUE(be().finite_check_passed());  // nothing under way
    return;
  }
  EXPECT_TRUE(be().finite_check_passed());  // the check begun above
  auto values = [](const std::vector<Tensor>& ts) {
    std::vector<std::vector<float>> out;
    for (const Tensor& t : ts) out.push_back(t.to_vector());
    return out;
  };
  const AdamUpdate adam{.learning_rate = 0.01f, .step = 2};
  const SgdUpdate sgd{.learning_rate = 0.1f, .momentum = 0.9f};
  const RmspropUpdate rms{.learning_rate = 0.01f};
  for (const std::string kind : {"sgd", "adam", "rmsprop"}) {
    auto many = [&] {
      return kind == "adam" ? be().adam_update_many(items, adam)
                            : kind == "sgd" ? be().sgd_update_many(items, sgd) : be().rmsprop_update_many(items, rms);
    };
    const std::vector<float> kept = g[33].to_vector();
    std::vector<float> bad = kept;
    bad[bad.size() / 2] = std::numeric_limits<float>::infinity();
    g[33].copy_from(Tensor::from_vector(g[33].shape(), bad));
    const auto w0 = values(w), m0 = values(m), v0 = values(v);
    ASSERT_TRUE(be().begin_finite_check(grads));
    many();
    EXPECT_FALSE(be().finite_check_passed()) << kind;
    EXPECT_EQ(values(w), w0) << kind << " wrote weights behind a failed check";
    EXPECT_EQ(values(m), m0) << kind;
    EXPECT_EQ(values(v), v0) << kind;
    g[33].copy_from(Tensor::from_vector(g[33].shape(), kept));
    ASSERT_TRUE(be().begin_finite_check(grads));
    many();
    EXPECT_TRUE(be().finite_check_passed()) << kind;
    const auto w1 = values(w);
    for (int i = 0; i < count; ++i) EXPECT_NE(w1[i], w0[i]) << kind << " left variable " << i << " as it was";
  }
  be().take_deferred_non_finite();
}

TEST_P(Conformance, FillAxpbyAndSumOfSquares) {
  const Tensor x = random_tensor({1001}, 60);
  Tensor y = out({1001});
  be().fill(y, std::numeric_limits<float>::quiet_NaN());
  be().axpby(2.0f, on(x), 0.0f, y);  // beta 0 ignores the NaNs
  std::vector<double> want = as_double(x.to_vector());
  for (double& w : want) w *= 2;
  expect_near(y.to_vector(), want, 1e-7, 0, "axpby with beta 0");
  be().axpby(1.0f, on(x), -0.5f, y);  // y = x - y / 2 = 0
  expect_near(y.to_vector(), std::vector<double>(1001, 0.0), 0, 1e-7, "axpby");
  double squares = 0;
  for (float v : x.to_vector()) squares += double(v) * v;
  EXPECT_NEAR(be().sum_squares(on(x)), squares, 1e-6 * squares);  // float partial sums, folded in double
  EXPECT_EQ(be().sum_squares(out({0})), 0.0);
}

// The mask is the same function of (seed, counter, element) on every backend.
TEST_P(Conformance, DropoutDrawsTheSameMaskAsTheGenerator) {
  const std::int64_t n = 70001;
  const Generator g(99, 12345);
  const Tensor x = random_tensor({n}, 61);
  Tensor y = out({n}), mask = out({n});
  be().dropout(on(x), 0.3f, g, y, mask);
  const auto m = mask.to_vector(), yv = y.to_vector(), xv = x.to_vector();
  for (std::int64_t i = 0; i < n; ++i) {
    const float want = g.uniform_at(static_cast<std::uint64_t>(i)) >= 0.3f ? 1.0f / 0.7f : 0.0f;
    ASSERT_EQ(m[static_cast<std::size_t>(i)], want) << i;
    ASSERT_EQ(yv[static_cast<std::size_t>(i)], xv[static_cast<std::size_t>(i)] * want) << i;
  }
}

TEST_P(Conformance, ArgmaxTakesTheFirstOfTiesAndOneHotMarksLabels) {
  const Tensor x = Tensor::from_vector({3, 4}, {1, 3, 3, 2, -1, -1, -1, -1, 0, 0, 5, 5});
  Tensor idx = out({3}, DType::i32);
  be().argmax(on(x), idx);
  EXPECT_EQ(idx.to_vector(), (std::vector<float>{1, 0, 2}));
  Tensor hot = out({3, 4});
  be().one_hot(on(Tensor::from_vector({3}, std::vector<std::int32_t>{3, 0, 2})), hot);
  EXPECT_EQ(hot.to_vector(), (std::vector<float>{0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0}));
}

TEST_P(Conformance, OptimizerUpdatesFollowKerasRules) {
  const std::int64_t n = 20011;
  for (int rule = 0; rule < 4; ++rule) {
    Tensor w = on(random_tensor({n}, 70)), m = Tensor::zeros({n}, DType::f32, device()),
           v = Tensor::zeros({n}, DType::f32, device()), vel = Tensor::zeros({n}, DType::f32, device());
    std::vector<double> rw = as_double(w.to_vector()), rm(n, 0), rv(n, 0), rvel(n, 0);
    for (int step = 1; step <= 3; ++step) {
      const Tensor g = random_tensor({n}, 70 + step);
      const auto gv = g.to_vector();
      if (rule == 0) {
        AdamUpdate p{.learning_rate = 0.01f, .step = step, .weight_decay = 0.1f, .gradient_scale = 0.5f};
        be().adam_update(w, on(g), m, v, p);
        const double a = 0.01 * std::sqrt(1 - std::pow(0.999, step)) / (1 - std::pow(0.9, step));
        for (std::int64_t i = 0; i < n; ++i) {
          const double gi = 0.5 * gv[static_cast<std::size_t>(i)];
          rm[i] = 0.9 * rm[i] + 0.1 * gi;
          rv[i] = 0.999 * rv[i] + 0.001 * gi * gi;
          rw[i] -= 0.01 * 0.1 * rw[i];
          rw[i] -= a * rm[i] / (std::sqrt(rv[i]) + 1e-7);
        }
      } else {
        const SgdUpdate p{.learning_rate = 0.1f, .momentum = rule == 1 ? 0.0f : 0.9f, .nesterov = rule == 3,
                          .weight_decay = 0.01f};
        be().sgd_update(w, on(g), rule == 1 ? nullptr : &vel, p);
        for (std::int64_t i = 0; i < n; ++i) {
          const double gi = gv[static_cast<std::size_t>(i)];
          rw[i] -= 0.1 * 0.01 * rw[i];
          if (rule == 1) {
            rw[i] -= 0.1 * gi;
          } else {
            rvel[i] = 0.9 * rvel[i] - 0.1 * gi;
            rw[i] += rule == 3 ? 0.9 * rvel[i] - 0.1 * gi : rvel[i];
          }
        }
      }
    }
    be().take_deferred_non_finite();
    expect_near(w.to_vector(), rw, 1e-5, 1e-6, "update rule " + std::to_string(rule));
  }
}

// RMSprop (plain, with momentum, centered with momentum) and Adagrad (its accumulator from
// 0.1), epsilon inside the root.
TEST_P(Conformance, RmspropAndAdagradFollowKeras3) {
  const std::int64_t n = 20011;
  for (int rule = 0; rule < 4; ++rule) {
    const bool adagrad = rule == 3, with_momentum = rule == 1 || rule == 2, centered = rule == 2;
    Tensor w = on(random_tensor({n}, 75)), v = on(Tensor::full({n}, adagrad ? 0.1f : 0.0f)),
           mom = Tensor::zeros({n}, DType::f32, device()), avg = Tensor::zeros({n}, DType::f32, device());
    std::vector<double> rw = as_double(w.to_vector()), rv(n, adagrad ? 0.1 : 0.0), rm(n, 0), ra(n, 0);
    const double rho = adagrad ? 1.0 : 0.8, weight = adagrad ? 1.0 : 0.2;
    for (int step = 1; step <= 3; ++step) {
      const Tensor g = random_tensor({n}, 75 + step);
      const auto gv = g.to_vector();
      RmspropUpdate p{.learning_rate = 0.01f, .rho = static_cast<float>(rho), .square_weight = static_cast<float>(weight),
                      .momentum = 0.5f, .epsilon = 1e-3f, .weight_decay = 0.1f, .gradient_scale = 0.5f};
      be().rmsprop_update(w, on(g), v, with_momentum ? &mom : nullptr, centered ? &avg : nullptr, p);
      for (std::int64_t i = 0; i < n; ++i) {
        const double gi = 0.5 * gv[static_cast<std::size_t>(i)];
        rv[i] = rho * rv[i] + weight * gi * gi;
        double denominator = rv[i];
        if (centered) {
          ra[i] = rho * ra[i] + weight * gi;
          denominator -= ra[i] * ra[i];
        }
        const double increment = 0.01 * gi / std::sqrt(denominator + 1e-3);
        rw[i] -= 0.01 * 0.1 * rw[i];
        if (with_momentum) {
          rm[i] = 0.5 * rm[i] + increment;
          rw[i] -= rm[i];
        } else {
          rw[i] -= increment;
        }
      }
    }
    be().take_deferred_non_finite();
    expect_near(w.to_vector(), rw, 1e-5, 1e-6, "rmsprop rule " + std::to_string(rule));
  }
}

// Many variables updated at once (one launch for up to 32 on a GPU): each as its own update
// with its own gradient scale, through groups of 32, empty variables and a NaN included.
TEST_P(Conformance, UpdatesOfManyVariablesAtOnceAreEachOnesOwn) {
  const int count = 37;  // two groups on a GPU
  for (const std::string kind : {"sgd", "adam", "rmsprop"}) {
    const bool adam = kind == "adam", rmsprop = kind == "rmsprop";
    std::vector<Tensor> w, g, s0, s1, s2, w1, s01, s11, s21;
    std::vector<UpdateItem> items;
    for (int i = 0; i < count; ++i) {
      const std::int64_t n = i % 9 == 4 ? 0 : 1 + (i * 977) % 3000;
      const auto seed = static_cast<std::uint64_t>(200 + 5 * i);
      w.push_back(on(random_tensor({n}, seed)));
      g.push_back(on(random_tensor({n}, seed + 1)));
      // RMSprop's v above its centered average's square, so v - a² stays positive.
      s0.push_back(on(rmsprop ? random_tensor({n}, seed + 2, 0.5f, 1.0f) : random_tensor({n}, seed + 2)));
      s1.push_back(on(random_tensor({n}, seed + 3, 0.0f, 1.0f)));
      s2.push_back(on(random_tensor({n}, seed + 4, -0.1f, 0.1f)));
      w1.push_back(w.back().clone());
      s01.push_back(s0.back().clone());
      s11.push_back(s1.back().clone());
      s21.push_back(s2.back().clone());
    }
    // RMSprop's variables with and without momentum and a centered average, each way.
    auto slot1 = [&](int i) -> Tensor* { return adam || (rmsprop && i % 3 != 0) ? &s1[i] : nullptr; };
    auto slot2 = [&](int i) -> Tensor* { return rmsprop && i % 2 == 1 ? &s2[i] : nullptr; };
    for (int i = 0; i < count; ++i)
      items.push_back({&w[i], &g[i], &s0[i], slot1(i), 0.5f + 0.01f * static_cast<float>(i), slot2(i)});
    const SgdUpdate sgd{.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 0.01f};
    const AdamUpdate adam_p{.learning_rate = 0.01f, .step = 3, .weight_decay = 0.02f};
    const RmspropUpdate rms{.learning_rate = 0.01f, .rho = 0.8f, .square_weight = 0.2f, .momentum = 0.5f,
                            .weight_decay = 0.01f};
    auto many = [&] {
      return adam ? be().adam_update_many(items, adam_p)
                  : rmsprop ? be().rmsprop_update_many(items, rms) : be().sgd_update_many(items, sgd);
    };
    be().take_deferred_non_finite();
    EXPECT_TRUE(many());
    EXPECT_FALSE(be().take_deferred_non_finite());
    for (int i = 0; i < count; ++i) {
      const std::string what = kind + "_update_many, variable " + std::to_string(i);
      const float scale = items[static_cast<std::size_t>(i)].gradient_scale;
      if (adam) {
        AdamUpdate one = adam_p;
        one.gradient_scale = scale;
        be().adam_update(w1[i], g[i], s01[i], s11[i], one);
      } else if (rmsprop) {
        RmspropUpdate one = rms;
        one.gradient_scale = scale;
        be().rmsprop_update(w1[i], g[i], s01[i], slot1(i) ? &s11[i] : nullptr, slot2(i) ? &s21[i] : nullptr, one);
      } else {
        SgdUpdate one = sgd;
        one.gradient_scale = scale;
        be().sgd_update(w1[i], g[i], &s01[i], one);
      }
      expect_near(w[i].to_vector(), as_double(w1[i].to_vector()), 1e-6, 0.0, what);
      expect_near(s0[i].to_vector(), as_double(s01[i].to_vector()), 1e-6, 0.0, what + " (slot 0)");
      expect_near(s1[i].to_vector(), as_double(s11[i].to_vector()), 1e-6, 0.0, what + " (slot 1)");
      expect_near(s2[i].to_vector(), as_double(s21[i].to_vector()), 1e-6, 0.0, what + " (slot 2)");
    }
    // A NaN in the last group is reported.
    Tensor bad = random_tensor({5}, 300);
    bad.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
    const Tensor bad_g = on(bad);
    Tensor five_w = on(random_tensor({5}, 301)), five_0 = on(random_tensor({5}, 302, 0.5f, 1.0f)),
           five_1 = on(random_tensor({5}, 303, 0.0f, 1.0f));
    items.back() = {&five_w, &bad_g, &five_0, adam || rmsprop ? &five_1 : nullptr, 1.0f};
    be().take_deferred_non_finite();
    const bool at_once = many();
    EXPECT_TRUE(!at_once || be().take_deferred_non_finite()) << kind;
  }
}

// A NaN written by an update is reported: at once by a backend that runs the update before
// returning, through take_deferred_non_finite() by one whose kernels run later.
TEST_P(Conformance, ANonFiniteWeightIsReported) {
  Tensor w = on(random_tensor({5000}, 80)), m = Tensor::zeros({5000}, DType::f32, device()),
         v = Tensor::zeros({5000}, DType::f32, device());
  Tensor g = random_tensor({5000}, 81);
  be().take_deferred_non_finite();
  EXPECT_TRUE(be().adam_update(w, on(g), m, v, AdamUpdate{}) && !be().take_deferred_non_finite());
  g.data<float>()[4321] = std::numeric_limits<float>::infinity();
  const bool at_once = be().adam_update(w, on(g), m, v, AdamUpdate{});
  EXPECT_TRUE(!at_once || be().take_deferred_non_finite());
  EXPECT_FALSE(be().take_deferred_non_finite());  // told once
}

TEST_P(Conformance, BatchNormSumsAndAffine) {
  const std::int64_t rows = 2049, c = 45;
  const Tensor a = random_tensor({rows, c}, 90), b = random_tensor({rows, c}, 91), center = random_tensor({c}, 92);
  Tensor sums = out({2, c});
  be().channel_sums(on(a), on(b), on(center), sums);
  const auto av = a.to_vector(), bv = b.to_vector(), cv = center.to_vector();
  std::vector<double> want(static_cast<std::size_t>(2 * c), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j) {
      want[j] += av[r * c + j];
      want[c + j] += double(av[r * c + j]) * (bv[r * c + j] - cv[j]);
    }
  expect_near(sums.to_vector(), want, 1e-6, 1e-5, "channel_sums");
  const Tensor scale = random_tensor({c}, 93), shift = random_tensor({c}, 94), scale2 = random_tensor({c}, 95);
  Tensor y = out({rows, c});
  const Tensor db = on(b), ds2 = on(scale2);
  be().channel_affine(on(a), on(scale), on(shift), y, &db, &ds2, /*relu=*/true);
  const auto sv = scale.to_vector(), tv = shift.to_vector(), s2 = scale2.to_vector();
  std::vector<double> ywant(av.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j)
      ywant[r * c + j] = std::max(0.0, double(av[r * c + j]) * sv[j] + tv[j] + double(bv[r * c + j]) * s2[j]);
  expect_near(y.to_vector(), ywant, 1e-6, 1e-6, "channel_affine with a second input and relu");
}

// Batch normalization's [C] figures, forward from sums and from given statistics, and
// backward; computed where the tensors are. A variance that rounding makes negative is 0.
TEST_P(Conformance, BatchNormFiguresForwardAndBackward) {
  const std::int64_t c = 37;
  const double n = 300.0;
  const float epsilon = 1e-3f;
  const Tensor mean = random_tensor({c}, 110, -2.0f, 2.0f), spread = random_tensor({c}, 111, 0.0f, 3.0f);
  const Tensor gamma = random_tensor({c}, 112), beta = random_tensor({c}, 113);
  const auto mv = mean.to_vector(), sv = spread.to_vector(), gv = gamma.to_vector(), bv = beta.to_vector();
  // The sums of n rows with these means and variances (the last channel's variance 0, rounded below it).
  std::vector<float> s(c), q(c);
  for (std::int64_t j = 0; j < c; ++j) {
    const double var = j + 1 == c ? 0.0 : sv[j];
    s[j] = static_cast<float>(mv[j] * n);
    q[j] = static_cast<float>((var + double(mv[j]) * mv[j]) * n);
  }
  q[c - 1] = std::nextafter(static_cast<float>(double(s[c - 1]) * s[c - 1] / n), 0.0f);
  for (const bool from_sums : {true, false}) {
    for (const bool affine : {true, false}) {
      const std::string what = std::string(from_sums ? "from sums" : "from statistics") + (affine ? "" : ", no gamma or beta");
      const Tensor a = from_sums ? Tensor::from_vector({c}, s) : mean;
      const Tensor b = from_sums ? Tensor::from_vector({c}, q) : spread;
      Tensor figures = out({5, c});
      be().batch_norm_coefficients(on(a), on(b), from_sums ? n : 0.0, affine ? on(gamma) : Tensor(),
                                   affine ? on(beta) : Tensor(), epsilon, figures);
      std::vector<double> want(static_cast<std::size_t>(5 * c));
      const auto av = a.to_vector(), bw = b.to_vector();
      for (std::int64_t j = 0; j < c; ++j) {
        const double m = from_sums ? av[j] / n : av[j];
        const double var = from_sums ? std::max(0.0, bw[j] / n - m * m) : bw[j];
        const double inv = 1.0 / std::sqrt(var + epsilon), g = affine ? gv[j] : 1.0, bt = affine ? bv[j] : 0.0;
        want[j] = m;
        want[c + j] = var;
        want[2 * c + j] = inv;
        want[3 * c + j] = g * inv;
        want[4 * c + j] = bt - m * g * inv;
      }
      expect_near(figures.to_vector(), want, 1e-6, 1e-6, "batch_norm_coefficients " + what);
      if (from_sums) {
        EXPECT_EQ(figures.to_vector()[static_cast<std::size_t>(2 * c - 1)], 0.0f) << what;
      }
    }
  }
  Tensor figures = out({5, c});
  be().batch_norm_coefficients(on(Tensor::from_vector({c}, s)), on(Tensor::from_vector({c}, q)), n, on(gamma),
                               on(beta), epsilon, figures);
  const Tensor sums = random_tensor({2, c}, 114), total = random_tensor({2, c}, 115, -5.0f, 5.0f);
  Tensor gradients = out({4, c});
  be().batch_norm_gradient_coefficients(on(sums), on(total), n, figures, gradients);
  const auto f = figures.to_vector(), sm = sums.to_vector(), tt = total.to_vector();
  std::vector<double> want(static_cast<std::size_t>(4 * c));
  for (std::int64_t j = 0; j < c; ++j) {
    const double m = f[j], inv = f[2 * c + j], scale = f[3 * c + j];
    want[j] = sm[c + j] * inv;
    want[c + j] = sm[j];
    want[2 * c + j] = -scale * inv * inv * tt[c + j] / n;
    want[3 * c + j] = -scale * tt[j] / n - want[2 * c + j] * m;
  }
  expect_near(gradients.to_vector(), want, 1e-6, 1e-6, "batch_norm_gradient_coefficients");
  const std::string bad = testing::message_of([&] {
    Tensor wrong = out({4, c + 1});
    be().batch_norm_gradient_coefficients(on(sums), on(total), n, figures, wrong);
  });
  EXPECT_NE(bad.find("gradients is [4, 38], expected [4, 37]"), std::string::npos) << bad;
}

TEST_P(Conformance, LayerNormForwardAndBackward) {
  for (const Shape& s : {Shape{1, 7}, Shape{65, 300}, Shape{3, 4099}}) {
    const std::int64_t rows = s[0], d = s[1];
    const Tensor x = random_tensor(s, 100, -3.0f, 3.0f), gamma = random_tensor({d}, 101), beta = random_tensor({d}, 102);
    const Tensor dy = random_tensor(s, 103);
    Tensor y = out(s), mean = out({rows}), inv_std = out({rows});
    be().layer_norm(on(x), on(gamma), on(beta), 1e-3f, y, mean, inv_std);
    Tensor dx = out(s), dgamma = out({d}), dbeta = out({d});
    be().layer_norm_backward(on(x), on(dy), on(gamma), mean, inv_std, dx, &dgamma, &dbeta);
    const auto xv = x.to_vector(), gv = gamma.to_vector(), bv = beta.to_vector(), dv = dy.to_vector();
    std::vector<double> ywant(xv.size()), dxwant(xv.size()), dgwant(static_cast<std::size_t>(d), 0.0),
        dbwant(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      double mu = 0, var = 0;
      for (std::int64_t j = 0; j < d; ++j) mu += xv[r * d + j];
      mu /= d;
      for (std::int64_t j = 0; j < d; ++j) var += (xv[r * d + j] - mu) * (xv[r * d + j] - mu);
      var /= d;
      const double is = 1 / std::sqrt(var + 1e-3);
      double sg = 0, sgh = 0;
      for (std::int64_t j = 0; j < d; ++j) {
        const double h = (xv[r * d + j] - mu) * is;
        ywant[r * d + j] = h * gv[j] + bv[j];
        sg += dv[r * d + j] * gv[j];
        sgh += dv[r * d + j] * gv[j] * h;
        dgwant[j] += dv[r * d + j] * h;
        dbwant[j] += dv[r * d + j];
      }
      for (std::int64_t j = 0; j < d; ++j) {
        const double h = (xv[r * d + j] - mu) * is;
        dxwant[r * d + j] = is * (dv[r * d + j] * gv[j] - sg / d - h * sgh / d);
      }
    }
    const std::string what = "layer_norm " + s.to_string();
    expect_near(y.to_vector(), ywant, 1e-5, 1e-5, what);
    expect_near(dx.to_vector(), dxwant, 1e-4, 1e-5, what + " dx");
    expect_near(dgamma.to_vector(), dgwant, 1e-5, 1e-4, what + " dgamma");
    expect_near(dbeta.to_vector(), dbwant, 1e-5, 1e-4, what + " dbeta");
  }
}

// Attention against its definition in double (forward), and on a GPU against the CPU
// backend (backward; the CPU's is checked against finite differences in the autograd
// tests), with a mask, causality and dropout over more queries and keys than one block.
TEST_P(Conformance, AttentionForwardAndBackward) {
  const std::int64_t B = 2, T = 45, S = 80, H = 2, D = 6, Dv = 5;
  const Tensor q = random_tensor({B, T, H, D}, 200), k = random_tensor({B, S, H, D}, 201),
               v = random_tensor({B, S, H, Dv}, 202), dout = random_tensor({B, T, H, Dv}, 203);
  Tensor mask = random_tensor({B, T, S}, 204, 0.0f, 1.0f);
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.data<float>()[i] = mask.data<float>()[i] < 0.25f ? 0.0f : 1.0f;
  for (std::int64_t s = 0; s < S; ++s) mask.data<float>()[3 * S + s] = 0.0f;  // batch 0's query 3 sees nothing
  for (const bool causal : {false, true}) {
    const Tensor m = on(mask);
    AttentionOptions o{.scale = 0.4f, .causal = causal, .mask = &m, .dropout_rate = 0.2f,
                       .dropout_generator = Generator(5, 7)};
    Tensor y = out({B, T, H, Dv}), lse = out({B, T, H});
    be().attention(on(q), on(k), on(v), o, y, lse);
    const auto qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector(), mv = mask.to_vector();
    std::vector<double> want(static_cast<std::size_t>(B * T * H * Dv), 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t) {
          std::vector<double> w(static_cast<std::size_t>(S), 0.0);
          double top = -INFINITY, sum = 0;
          for (std::int64_t s = 0; s < S; ++s) {
            if ((causal && s > t) || mv[(b * T + t) * S + s] == 0.0f) continue;
            double x = 0;
            for (std::int64_t d = 0; d < D; ++d) x += double(qv[((b * T + t) * H + h) * D + d]) * kv[((b * S + s) * H + h) * D + d];
            w[s] = 0.4 * x;
            top = std::max(top, w[s]);
          }
          if (top == -INFINITY) continue;
          for (std::int64_t s = 0; s < S; ++s)
            if (!((causal && s > t) || mv[(b * T + t) * S + s] == 0.0f)) sum += (w[s] = std::exp(w[s] - top));
            else w[s] = 0;
          for (std::int64_t s = 0; s < S; ++s) {
            const auto i = static_cast<std::uint64_t>(((b * H + h) * T + t) * S + s);
            const double kept = o.dropout_generator.uniform_at(i) >= 0.2f ? w[s] / sum / 0.8 : 0.0;
            for (std::int64_t j = 0; j < Dv; ++j) want[((b * T + t) * H + h) * Dv + j] += kept * vv[((b * S + s) * H + h) * Dv + j];
          }
        }
    expect_near(y.to_vector(), want, 1e-5, 1e-5, causal ? "causal attention" : "attention");
    EXPECT_EQ(lse.to_vector()[3 * H], -INFINITY) << "a query that sees no key";
    Tensor dq = out(q.shape()), dk = out(k.shape()), dv = out(v.shape());
    be().attention_backward(on(q), on(k), on(v), y, lse, on(dout), o, dq, dk, dv);
    if (gpu()) {
      AttentionOptions h = o;
      h.mask = &mask;
      Tensor hy = Tensor::empty(y.shape()), hl = Tensor::empty(lse.shape()), hq = Tensor::empty(q.shape()),
             hk = Tensor::empty(k.shape()), hv = Tensor::empty(v.shape());
      backend(Device::cpu()).attention(q, k, v, h, hy, hl);
      backend(Device::cpu()).attention_backward(q, k, v, hy, hl, dout, h, hq, hk, hv);
      expect_same_as_cpu(dq, hq, 1e-4, 1e-5, "attention dq");
      expect_same_as_cpu(dk, hk, 1e-4, 1e-5, "attention dk");
      expect_same_as_cpu(dv, hv, 1e-4, 1e-5, "attention dv");
    }
    const auto g = dq.to_vector();
    for (std::int64_t j = 0; j < D; ++j) EXPECT_EQ(g[static_cast<std::size_t>(3 * H * D + j)], 0.0f) << "no gradient for it";
  }
}

// A mask of the keys alone ([B, 1, S]: padding) and one for every batch entry ([1, T, S])
// are read as the same masks written out [B, T, S]: the same forward and backward.
TEST_P(Conformance, AttentionReadsABroadcastMaskForEveryQueryOrBatchEntry) {
  const std::int64_t B = 2, T = 37, S = 70, H = 2, D = 64, Dv = 64;
  const Tensor q = random_tensor({B, T, H, D}, 210), k = random_tensor({B, S, H, D}, 211),
               v = random_tensor({B, S, H, Dv}, 212), dout = random_tensor({B, T, H, Dv}, 213);
  Tensor keys = Tensor::full(Shape{B, 1, S}, 1.0f), rows = random_tensor({1, T, S}, 214, 0.0f, 1.0f);
  for (std::int64_t s = S - 9; s < S; ++s) keys.data<float>()[S + s] = 0.0f;  // batch 1's last keys are padding
  for (std::int64_t i = 0; i < rows.numel(); ++i) rows.data<float>()[i] = rows.data<float>()[i] < 0.3f ? 0.0f : 1.0f;
  for (const Tensor* broadcast : {&keys, &rows}) {
    Tensor whole = Tensor::empty(Shape{B, T, S});
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t s = 0; s < S; ++s)
          whole.data<float>()[(b * T + t) * S + s] =
              broadcast->data<float>()[(broadcast->dim(0) == 1 ? 0 : b) * broadcast->dim(1) * S +
                                       (broadcast->dim(1) == 1 ? 0 : t) * S + s];
    std::vector<std::vector<float>> results[2];
    for (int which = 0; which < 2; ++which) {
      const Tensor m = on(which == 0 ? *broadcast : whole);
      const AttentionOptions o{.scale = 0.125f, .causal = true, .mask = &m};
      Tensor y = out({B, T, H, Dv}), lse = out({B, T, H}), dq = out(q.shape()), dk = out(k.shape()), dv = out(v.shape());
      be().attention(on(q), on(k), on(v), o, y, lse);
      be().attention_backward(on(q), on(k), on(v), y, lse, on(dout), o, dq, dk, dv);
      results[which] = {y.to_vector(), dq.to_vector(), dk.to_vector(), dv.to_vector()};
    }
    // Equal up to the order of a GPU's atomic sums.
    const std::string what = broadcast == &keys ? "[B, 1, S] " : "[1, T, S] ";
    for (std::size_t i = 0; i < 4; ++i)
      expect_near(results[0][i], std::vector<double>(results[1][i].begin(), results[1][i].end()), 1e-5, 1e-6,
                  what + std::to_string(i));
  }
}

TEST_P(Conformance, CopyBlockMovesStridedRowsOfEveryDtype) {
  for (const DType dtype : {DType::f32, DType::bf16, DType::u8, DType::i32}) {
    const Tensor src = random_tensor({2, 5, 8}, 110, 0.0f, 100.0f).astype(dtype);
    Tensor dst = Tensor::zeros({2, 7, 10}, dtype, device());
    // rows 1..3 of each outer block, 6 values from column 2, into rows 2..4 from column 1
    be().copy_block(on(src), {.offset = 8 + 2, .outer_stride = 40, .row_stride = 8}, dst,
                    {.offset = 20 + 1, .outer_stride = 70, .row_stride = 10}, 2, 3, 6);
    const auto s = src.to_vector(), d = dst.to_vector();
    for (int i = 0; i < 2; ++i)
      for (int r = 0; r < 7; ++r)
        for (int col = 0; col < 10; ++col) {
          const bool inside = r >= 2 && r < 5 && col >= 1 && col < 7;
          const float want = inside ? s[static_cast<std::size_t>(i * 40 + (r - 1) * 8 + col + 1)] : 0.0f;
          ASSERT_EQ(d[static_cast<std::size_t>(i * 70 + r * 10 + col)], want)
              << dtype_name(dtype) << " at " << i << "," << r << "," << col;
        }
  }
}

// ---- convolution and pooling

struct ConvCase {
  std::int64_t n, h, w, c, kh, kw, f;
  Conv2dOptions o;
  const char* name;
};

Conv2dOptions conv_options(std::int64_t stride, std::int64_t dilation, std::int64_t pb_h, std::int64_t pe_h,
                           std::int64_t pb_w, std::int64_t pe_w, std::int64_t groups) {
  Conv2dOptions o;
  o.stride[0] = o.stride[1] = stride;
  o.dilation[0] = o.dilation[1] = dilation;
  o.pad_begin[0] = pb_h;
  o.pad_end[0] = pe_h;
  o.pad_begin[1] = pb_w;
  o.pad_end[1] = pe_w;
  o.groups = groups;
  return o;
}

const ConvCase kConvCases[] = {
    {2, 7, 6, 4, 3, 3, 6, conv_options(1, 1, 1, 1, 1, 1, 1), "3x3 same"},
    {2, 8, 8, 3, 3, 3, 5, conv_options(2, 1, 0, 1, 0, 1, 1), "3x3 stride 2, uneven padding"},
    {1, 9, 7, 2, 3, 2, 4, conv_options(1, 2, 2, 2, 1, 1, 1), "dilation 2"},
    {2, 5, 5, 4, 3, 3, 6, conv_options(1, 1, 1, 1, 1, 1, 2), "two groups"},
    {2, 6, 6, 3, 3, 3, 6, conv_options(1, 1, 1, 1, 1, 1, 3), "depthwise, multiplier 2"},
    {3, 4, 4, 8, 1, 1, 16, conv_options(1, 1, 0, 0, 0, 0, 1), "1x1"},
    {0, 5, 5, 2, 3, 3, 2, conv_options(1, 1, 1, 1, 1, 1, 1), "an empty batch"},
};

struct ConvReference {
  std::vector<double> y, dx, dk, db;
};

// y = conv(x, k) + bias; and for dy: dx, dk and db, by the definitions, in double.
ConvReference conv_reference(const ConvCase& s, const Tensor& x, const Tensor& k, const Tensor& bias,
                             const Tensor& dy) {
  const auto xv = x.to_vector(), kv = k.to_vector(), bv = bias.to_vector(), gv = dy.to_vector();
  const Conv2dOptions& o = s.o;
  const std::int64_t oh_n = conv_out(s.h, s.kh, o.stride[0], o.dilation[0], o.pad_begin[0], o.pad_end[0]);
  const std::int64_t ow_n = conv_out(s.w, s.kw, o.stride[1], o.dilation[1], o.pad_begin[1], o.pad_end[1]);
  const std::int64_t cg = s.c / o.groups, fg = s.f / o.groups;
  ConvReference r;
  r.y.assign(static_cast<std::size_t>(s.n * oh_n * ow_n * s.f), 0.0);
  r.dx.assign(xv.size(), 0.0);
  r.dk.assign(kv.size(), 0.0);
  r.db.assign(static_cast<std::size_t>(s.f), 0.0);
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t f = 0; f < s.f; ++f) {
          const std::int64_t out = ((n * oh_n + oh) * ow_n + ow) * s.f + f, g = f / fg;
          double sum = bv[static_cast<std::size_t>(f)];
          const double grad = gv[static_cast<std::size_t>(out)];
          r.db[static_cast<std::size_t>(f)] += grad;
          for (std::int64_t kh = 0; kh < s.kh; ++kh)
            for (std::int64_t kw = 0; kw < s.kw; ++kw) {
              const std::int64_t ih = oh * o.stride[0] - o.pad_begin[0] + kh * o.dilation[0];
              const std::int64_t iw = ow * o.stride[1] - o.pad_begin[1] + kw * o.dilation[1];
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              for (std::int64_t ci = 0; ci < cg; ++ci) {
                const auto xi = static_cast<std::size_t>(((n * s.h + ih) * s.w + iw) * s.c + g * cg + ci);
                const auto ki = static_cast<std::size_t>(((kh * s.kw + kw) * cg + ci) * s.f + f);
                sum += double(xv[xi]) * kv[ki];
                r.dx[xi] += grad * kv[ki];
                r.dk[ki] += grad * xv[xi];
              }
            }
          r.y[static_cast<std::size_t>(out)] = sum;
        }
  return r;
}

TEST_P(Conformance, ConvolutionsForwardAndBackward) {
  for (const ConvCase& s : kConvCases)
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      const Conv2dOptions& o = s.o;
      const std::int64_t oh = conv_out(s.h, s.kh, o.stride[0], o.dilation[0], o.pad_begin[0], o.pad_end[0]);
      const std::int64_t ow = conv_out(s.w, s.kw, o.stride[1], o.dilation[1], o.pad_begin[1], o.pad_end[1]);
      // bfloat16 operands: the reference takes the same rounded values.
      const Tensor x = random_tensor({s.n, s.h, s.w, s.c}, 120).astype(dtype).astype(DType::f32);
      const Tensor k = random_tensor({s.kh, s.kw, s.c / o.groups, s.f}, 121).astype(dtype).astype(DType::f32);
      const Tensor bias = random_tensor({s.f}, 122), dy = random_tensor({s.n, oh, ow, s.f}, 123).astype(dtype).astype(DType::f32);
      const ConvReference r = conv_reference(s, x, k, bias, dy);
      const Tensor xd = on(x.astype(dtype)), kd = on(k.astype(dtype)), dyd = on(dy.astype(dtype)), bd = on(bias);
      Tensor y = out({s.n, oh, ow, s.f}), dx = out({s.n, s.h, s.w, s.c}), dk = out(k.shape()), db = out({s.f});
      Conv2dOptions with_bias = o;
      with_bias.bias = &bd;
      be().conv2d(xd, kd, y, with_bias);
      be().conv2d_backward_data(dyd, kd, dx, o);
      be().conv2d_backward_weights(xd, dyd, dk, &db, o);
      // A GPU's 16-bit convolutions round their result to 16 bits: bfloat16's 8 bits 1e-2
      // relative, float16's 11 bits 2e-3.
      const double rounded = dtype == DType::bf16 ? 1e-2 : 2e-3;
      const double rtol = is_half(dtype) && gpu() ? rounded : 2e-5, atol = is_half(dtype) && gpu() ? rounded : 2e-5;
      const std::string what = std::string("conv2d ") + s.name + " (" + std::string(dtype_name(dtype)) + ")";
      expect_near(y.to_vector(), r.y, rtol, atol, what);
      expect_near(dx.to_vector(), r.dx, rtol, atol, what + " dx");
      expect_near(dk.to_vector(), r.dk, rtol, atol * 10, what + " dkernel");
      expect_near(db.to_vector(), r.db, 1e-5, 1e-4, what + " dbias");
    }
}

TEST_P(Conformance, ConvolutionFusesItsActivation) {
  const ConvCase& s = kConvCases[0];
  const Tensor x = random_tensor({s.n, s.h, s.w, s.c}, 124), k = random_tensor({s.kh, s.kw, s.c, s.f}, 125);
  Tensor y = out({s.n, s.h, s.w, s.f});
  Conv2dOptions o = s.o;
  o.activation = Activation::tanh;
  be().conv2d(on(x), on(k), y, o);
  const ConvReference r = conv_reference(s, x, k, Tensor::zeros({s.f}), Tensor::zeros({s.n, s.h, s.w, s.f}));
  std::vector<double> want = r.y;
  for (double& v : want) v = std::tanh(v);
  expect_near(y.to_vector(), want, 2e-5, 2e-5, "conv2d with tanh");
}

TEST_P(Conformance, PoolingMaxAndAverageWithTheirBackward) {
  struct Case {
    Shape x;
    Pool2dOptions o;
  };
  auto opts = [](Pool kind, std::int64_t window, std::int64_t stride, std::int64_t pb, std::int64_t pe) {
    Pool2dOptions o;
    o.kind = kind;
    o.window[0] = o.window[1] = window;
    o.stride[0] = o.stride[1] = stride;
    o.pad_begin[0] = o.pad_begin[1] = pb;
    o.pad_end[0] = o.pad_end[1] = pe;
    return o;
  };
  for (const Pool kind : {Pool::max, Pool::average})
    for (const Case& c : {Case{{2, 6, 6, 3}, opts(kind, 2, 2, 0, 0)}, Case{{1, 7, 5, 2}, opts(kind, 3, 2, 1, 1)},
                          Case{{2, 5, 5, 4}, opts(kind, 3, 1, 1, 1)}, Case{{1, 4, 4, 1}, opts(kind, 2, 2, 0, 1)}}) {
      const std::int64_t n = c.x[0], h = c.x[1], w = c.x[2], ch = c.x[3];
      const Pool2dOptions& o = c.o;
      const std::int64_t oh = conv_out(h, o.window[0], o.stride[0], 1, o.pad_begin[0], o.pad_end[0]);
      const std::int64_t ow = conv_out(w, o.window[1], o.stride[1], 1, o.pad_begin[1], o.pad_end[1]);
      const Tensor x = random_tensor(c.x, 130), dy = random_tensor({n, oh, ow, ch}, 131);
      const auto xv = x.to_vector(), gv = dy.to_vector();
      std::vector<double> want(static_cast<std::size_t>(n * oh * ow * ch)), dwant(xv.size(), 0.0);
      for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t i = 0; i < oh; ++i)
          for (std::int64_t j = 0; j < ow; ++j)
            for (std::int64_t k = 0; k < ch; ++k) {
              const auto o_at = static_cast<std::size_t>(((b * oh + i) * ow + j) * ch + k);
              double best = -INFINITY, sum = 0;
              std::size_t arg = 0;
              int taps = 0;
              for (std::int64_t a = 0; a < o.window[0]; ++a)
                for (std::int64_t e = 0; e < o.window[1]; ++e) {
                  const std::int64_t ih = i * o.stride[0] - o.pad_begin[0] + a, iw = j * o.stride[1] - o.pad_begin[1] + e;
                  if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                  const auto at = static_cast<std::size_t>(((b * h + ih) * w + iw) * ch + k);
                  if (xv[at] > best) {
                    best = xv[at];
                    arg = at;
                  }
                  sum += xv[at];
                  ++taps;
                }
              want[o_at] = kind == Pool::max ? best : sum / taps;
              if (kind == Pool::max) {
                dwant[arg] += gv[o_at];
              } else {
                for (std::int64_t a = 0; a < o.window[0]; ++a)
                  for (std::int64_t e = 0; e < o.window[1]; ++e) {
                    const std::int64_t ih = i * o.stride[0] - o.pad_begin[0] + a, iw = j * o.stride[1] - o.pad_begin[1] + e;
                    if (ih >= 0 && ih < h && iw >= 0 && iw < w)
                      dwant[static_cast<std::size_t>(((b * h + ih) * w + iw) * ch + k)] += gv[o_at] / taps;
                  }
              }
            }
      Tensor y = out({n, oh, ow, ch}), dx = out(c.x);
      Tensor ws = out({static_cast<std::int64_t>(be().pool2d_workspace_bytes(c.x, o))}, DType::u8);
      be().pool2d(on(x), y, kind == Pool::max ? &ws : nullptr, o);
      be().pool2d_backward(on(dy), kind == Pool::max ? &ws : nullptr, dx, o);
      const std::string what = std::string(kind == Pool::max ? "max" : "average") + " pooling of " + c.x.to_string();
      expect_near(y.to_vector(), want, 1e-6, 1e-7, what);
      expect_near(dx.to_vector(), dwant, 1e-6, 1e-6, what + " backward");
    }
}

// Operands on two devices are an error naming both (nothing is copied behind the caller).
TEST_P(Conformance, OperandsOnAnotherDeviceAreNamed) {
  if (!gpu()) GTEST_SKIP() << "one device: nothing to mix";
  Tensor c = out({2, 2});
  try {
    be().binary(Binary::add, on(Tensor::full({2, 2}, 1.0f)), Tensor::full({2, 2}, 1.0f), c);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cpu:0"), std::string::npos) << m;
    EXPECT_NE(m.find(device().to_string()), std::string::npos) << m;
  }
}

// Past 2^31 bytes: 64-bit offsets in every kernel's indexing (a GPU's memory allows it).
TEST_P(Conformance, TensorsPastTwoGibibytes) {
  if (!gpu()) GTEST_SKIP() << "on the CPU this is the matmul test's parts (Matmul.AnOperandPast...)";
  const std::int64_t n = (std::int64_t{1} << 29) + 7;  // 2 GiB + 28 bytes of float32
  Tensor x = Tensor::empty({n}, DType::f32, device());
  be().fill(x, 1.5f);
  Tensor y = Tensor::empty({n}, DType::f32, device());
  be().unary(Unary::square, x, y, 1.0f, 0.0f);
  be().axpby(1.0f, x, 1.0f, y);  // 2.25 + 1.5
  Tensor tail = Tensor::empty({4});
  tail.copy_from(y.slice(n - 4, n));
  EXPECT_EQ(tail.to_vector(), (std::vector<float>{3.75f, 3.75f, 3.75f, 3.75f}));
  EXPECT_NEAR(be().sum_squares(x), 2.25 * static_cast<double>(n), 1e-6 * 2.25 * static_cast<double>(n));
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Values(BackendCase{"cpu", Device::cpu()}, BackendCase{"cuda", Device::cuda(0)}),
                         [](const ::testing::TestParamInfo<BackendCase>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace dtrain::kernels
