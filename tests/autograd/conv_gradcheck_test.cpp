// Convolution, pooling, normalization and the shape ops of convolutional networks: forward
// against direct loops written from the definitions, gradients against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/gradcheck.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::GradcheckOptions;
using testing::random_tensor;
using Inputs = std::vector<Tensor>;

// conv2d from its definition: x [N, H, W, C], k [KH, KW, C / g, F].
Tensor reference_conv(const Tensor& x, const Tensor& k, const Tensor& bias, const Conv2dOptions& o) {
  const std::int64_t n = x.dim(0), h = x.dim(1), w = x.dim(2), c = x.dim(3);
  const std::int64_t kh = k.dim(0), kw = k.dim(1), cg = k.dim(2), f = k.dim(3), fg = f / o.groups;
  const std::int64_t oh = (h + o.pad_begin[0] + o.pad_end[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const std::int64_t ow = (w + o.pad_begin[1] + o.pad_end[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  Tensor y = Tensor::zeros({n, oh, ow, f});
  const float* px = x.data<float>();
  const float* pk = k.data<float>();
  float* py = y.data<float>();
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j)
        for (std::int64_t q = 0; q < f; ++q) {
          const std::int64_t g = q / fg;
          double acc = bias.defined() ? bias.data<float>()[q] : 0.0;
          for (std::int64_t u = 0; u < kh; ++u)
            for (std::int64_t v = 0; v < kw; ++v) {
              const std::int64_t r = i * o.stride[0] - o.pad_begin[0] + u * o.dilation[0];
              const std::int64_t s = j * o.stride[1] - o.pad_begin[1] + v * o.dilation[1];
              if (r < 0 || r >= h || s < 0 || s >= w) continue;
              for (std::int64_t e = 0; e < cg; ++e)
                acc += static_cast<double>(px[((b * h + r) * w + s) * c + g * cg + e]) *
                       pk[((u * kw + v) * cg + e) * f + q];
            }
          py[((b * oh + i) * ow + j) * f + q] = static_cast<float>(acc);
        }
  return y;
}

void expect_close(const Tensor& a, const Tensor& b, float tol) {
  ASSERT_EQ(a.shape(), b.shape());
  const auto u = a.to_vector(), v = b.to_vector();
  for (std::size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(u[i], v[i], tol) << "element " << i;
}

struct ConvCase {
  const char* name;
  Shape x, k;
  Conv2dOptions o;
};

std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cases;
  cases.push_back({"3x3 same", {2, 5, 5, 3}, {3, 3, 3, 4}, {}});
  cases.back().o.pad_begin[0] = cases.back().o.pad_begin[1] = cases.back().o.pad_end[0] = cases.back().o.pad_end[1] = 1;
  cases.push_back({"valid, stride 2, odd sizes", {2, 7, 6, 2}, {3, 2, 2, 3}, {}});
  cases.back().o.stride[0] = cases.back().o.stride[1] = 2;
  cases.push_back({"dilation 2, uneven padding", {1, 7, 7, 2}, {3, 3, 2, 2}, {}});
  cases.back().o.dilation[0] = cases.back().o.dilation[1] = 2;
  cases.back().o.pad_begin[0] = 1;
  cases.back().o.pad_end[0] = 2;
  cases.back().o.pad_end[1] = 1;
  cases.push_back({"1x1, batch of 1", {1, 3, 4, 5}, {1, 1, 5, 3}, {}});
  cases.push_back({"depthwise (groups = channels, 2 filters each)", {2, 5, 5, 3}, {3, 3, 1, 6}, {}});
  cases.back().o.groups = 3;
  cases.back().o.pad_begin[0] = cases.back().o.pad_begin[1] = cases.back().o.pad_end[0] = cases.back().o.pad_end[1] = 1;
  cases.push_back({"two groups, stride (1, 2)", {2, 4, 6, 4}, {2, 3, 2, 4}, {}});
  cases.back().o.groups = 2;
  cases.back().o.stride[1] = 2;
  return cases;
}

TEST(ConvOps, Conv2dMatchesItsDefinition) {
  std::uint64_t seed = 10;
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor(c.x, ++seed), k = random_tensor(c.k, ++seed), b = random_tensor({c.k[3]}, ++seed);
    expect_close(conv2d(x, k, b, c.o), reference_conv(x, k, b, c.o), 1e-5f);
    expect_close(conv2d(x, k, Tensor(), c.o), reference_conv(x, k, Tensor(), c.o), 1e-5f);
  }
}

TEST(ConvOps, Conv2dGradients) {
  std::uint64_t seed = 40;
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor(c.x, ++seed), k = random_tensor(c.k, ++seed), b = random_tensor({c.k[3]}, ++seed);
    const Conv2dOptions o = c.o;
    expect_gradients_match([o](const Inputs& in) { return conv2d(in[0], in[1], in[2], o); }, {x, k, b}, {0, 1, 2});
  }
}

TEST(ConvOps, FusedActivationsHaveTheirDerivatives) {
  for (Activation act : {Activation::relu, Activation::sigmoid, Activation::tanh, Activation::gelu}) {
    SCOPED_TRACE(static_cast<int>(act));
    Conv2dOptions o;
    o.activation = act;
    // A kernel and bias that keep pre-activations away from relu's kink at 0.
    const Tensor x = random_tensor({1, 4, 4, 2}, 7, 0.5f, 1.0f), k = random_tensor({2, 2, 2, 3}, 8, 0.2f, 0.6f);
    const Tensor b = Tensor::from_vector({3}, {0.1f, -3.0f, 0.2f});
    const Tensor y = conv2d(x, k, b, o);
    const Tensor z = conv2d(x, k, b, {});
    expect_close(y, activation(z, act == Activation::relu      ? "relu"
                                  : act == Activation::sigmoid ? "sigmoid"
                                  : act == Activation::tanh    ? "tanh"
                                                               : "gelu"),
                 1e-5f);
    expect_gradients_match([o](const Inputs& in) { return conv2d(in[0], in[1], in[2], o); }, {x, k, b}, {0, 1, 2});
  }
}

TEST(ConvOps, MixedPrecisionConvIsFloat32OnRoundedInputs) {
  auto rounded = [](const Tensor& t) { return t.astype(DType::bf16).astype(DType::f32); };
  Conv2dOptions o;
  o.pad_begin[0] = o.pad_begin[1] = o.pad_end[0] = o.pad_end[1] = 1;
  const Tensor x = random_tensor({2, 6, 6, 8}, 3), k = random_tensor({3, 3, 8, 16}, 4), b = random_tensor({16}, 5);
  expect_close(conv2d(x, k, b, o, DType::bf16), conv2d(rounded(x), rounded(k), b, o), 1e-5f);
}

TEST(ConvOps, BadShapesAreNamed) {
  const Tensor x = random_tensor({1, 4, 4, 3}, 1);
  EXPECT_THROW(
      {
        try {
          conv2d(x, random_tensor({3, 3, 2, 4}, 2), Tensor(), {});
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("[1, 4, 4, 3]"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("[3, 3, 2, 4]"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  EXPECT_THROW(conv2d(x, random_tensor({5, 5, 3, 4}, 2), Tensor(), {}), InvalidArgument);  // larger than the image
  Conv2dOptions o;
  o.groups = 2;
  EXPECT_THROW(conv2d(x, random_tensor({3, 3, 1, 4}, 2), Tensor(), o), InvalidArgument);  // 2 does not divide 3
}

// Distinct values far apart, so that a finite-difference step never changes which is the maximum.
Tensor spaced(const Shape& shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i) - 1.0f;
  Generator g(seed);
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.next_u64() % i]);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

TEST(ConvOps, PoolingMatchesItsDefinitionAndGradients) {
  for (kernels::Pool kind : {kernels::Pool::max, kernels::Pool::average}) {
    for (int padded = 0; padded < 2; ++padded) {
      SCOPED_TRACE(::testing::Message() << (kind == kernels::Pool::max ? "max" : "average") << " padded " << padded);
      Pool2dOptions o;
      o.kind = kind;
      o.window[0] = 3;
      o.window[1] = 2;
      o.stride[0] = 2;
      o.stride[1] = 1;
      if (padded) o.pad_begin[0] = o.pad_end[0] = o.pad_end[1] = 1;
      const Tensor x = spaced({2, 5, 4, 3}, 9);
      const Tensor y = pool2d(x, o);
      // The definition: over the window's taps inside the image.
      const std::int64_t oh = y.dim(1), ow = y.dim(2);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t i = 0; i < oh; ++i)
          for (std::int64_t j = 0; j < ow; ++j)
            for (std::int64_t c = 0; c < 3; ++c) {
              double best = -1e30, sum = 0.0;
              int taps = 0;
              for (std::int64_t u = 0; u < 3; ++u)
                for (std::int64_t v = 0; v < 2; ++v) {
                  const std::int64_t r = i * 2 - o.pad_begin[0] + u, s = j - o.pad_begin[1] + v;
                  if (r < 0 || r >= 5 || s < 0 || s >= 4) continue;
                  const float value = x.data<float>()[((b * 5 + r) * 4 + s) * 3 + c];
                  best = std::max<double>(best, value);
                  sum += value;
                  ++taps;
                }
              const double expected = kind == kernels::Pool::max ? best : sum / taps;
              ASSERT_NEAR(y.data<float>()[((b * oh + i) * ow + j) * 3 + c], expected, 1e-5);
            }
      expect_gradients_match([o](const Inputs& in) { return pool2d(in[0], o); }, {x}, {0});
    }
  }
}

TEST(NormOps, BatchNormMatchesTheFormulasAndGradients) {
  const Tensor x = random_tensor({3, 2, 2, 4}, 21, -2.0f, 3.0f);
  const Tensor gamma = random_tensor({4}, 22, 0.5f, 1.5f), beta = random_tensor({4}, 23);
  Tensor mean, variance;
  const Tensor y = batch_norm(x, gamma, beta, 1e-3f, false, &mean, &variance);
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (int c = 0; c < 4; ++c) {
    double m = 0, v = 0;
    for (int r = 0; r < 12; ++r) m += xv[static_cast<std::size_t>(r * 4 + c)];
    m /= 12;
    for (int r = 0; r < 12; ++r) v += std::pow(xv[static_cast<std::size_t>(r * 4 + c)] - m, 2);
    v /= 12;  // biased, as Keras normalizes
    EXPECT_NEAR(mean.data<float>()[c], m, 1e-5);
    EXPECT_NEAR(variance.data<float>()[c], v, 1e-5);
    for (int r = 0; r < 12; ++r) {
      const double expected = (xv[static_cast<std::size_t>(r * 4 + c)] - m) / std::sqrt(v + 1e-3) *
                                  gamma.data<float>()[c] + beta.data<float>()[c];
      EXPECT_NEAR(yv[static_cast<std::size_t>(r * 4 + c)], expected, 1e-5);
    }
  }
  GradcheckOptions opt;
  opt.eps = 1e-3;
  expect_gradients_match([](const Inputs& in) { return batch_norm(in[0], in[1], in[2], 1e-3f, false); },
                         {x, gamma, beta}, {0, 1, 2}, opt);
  // Rank 2 (after a Dense layer), without gamma and beta.
  expect_gradients_match([](const Inputs& in) { return batch_norm(in[0], Tensor(), Tensor(), 1e-3f, false); },
                         {random_tensor({5, 3}, 24)}, {0}, opt);
}

TEST(NormOps, BatchNormInferenceUsesTheGivenStatistics) {
  const Tensor x = random_tensor({4, 3}, 31);
  const Tensor mean = random_tensor({3}, 32), variance = random_tensor({3}, 33, 0.5f, 2.0f);
  const Tensor gamma = random_tensor({3}, 34, 0.5f, 1.5f), beta = random_tensor({3}, 35);
  const Tensor y = batch_norm_inference(x, mean, variance, gamma, beta, 1e-3f);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) {
      const double expected = (x.data<float>()[r * 3 + c] - mean.data<float>()[c]) /
                                  std::sqrt(variance.data<float>()[c] + 1e-3) * gamma.data<float>()[c] +
                              beta.data<float>()[c];
      EXPECT_NEAR(y.data<float>()[r * 3 + c], expected, 1e-5);
    }
  expect_gradients_match([=](const Inputs& in) { return batch_norm_inference(in[0], mean, variance, in[1], in[2], 1e-3f); },
                         {x, gamma, beta}, {0, 1, 2});
}

TEST(NormOps, LayerNormMatchesTheFormulaAndGradients) {
  const Tensor x = random_tensor({2, 3, 5}, 41, -2.0f, 2.0f);
  const Tensor gamma = random_tensor({5}, 42, 0.5f, 1.5f), beta = random_tensor({5}, 43);
  const Tensor y = layer_norm(x, gamma, beta, 1e-3f);
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (int r = 0; r < 6; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 5; ++j) m += xv[static_cast<std::size_t>(r * 5 + j)];
    m /= 5;
    for (int j = 0; j < 5; ++j) v += std::pow(xv[static_cast<std::size_t>(r * 5 + j)] - m, 2);
    v /= 5;
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(yv[static_cast<std::size_t>(r * 5 + j)],
                  (xv[static_cast<std::size_t>(r * 5 + j)] - m) / std::sqrt(v + 1e-3) * gamma.data<float>()[j] +
                      beta.data<float>()[j],
                  1e-5);
  }
  GradcheckOptions opt;
  opt.eps = 1e-3;
  expect_gradients_match([](const Inputs& in) { return layer_norm(in[0], in[1], in[2], 1e-3f); }, {x, gamma, beta},
                         {0, 1, 2}, opt);
}

TEST(ShapeOps, ConcatenateAndPadding) {
  const Tensor a = random_tensor({2, 3, 2}, 51), b = random_tensor({2, 1, 2}, 52);
  const Tensor y = concatenate({a, b}, 1);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 2}));
  EXPECT_EQ(y.data<float>()[6], b.data<float>()[0]);     // row 0, position 3
  EXPECT_EQ(y.data<float>()[8], a.data<float>()[6]);     // row 1, position 0
  expect_gradients_match([](const Inputs& in) { return concatenate({in[0], in[1]}, 1); }, {a, b}, {0, 1});
  expect_gradients_match([](const Inputs& in) { return concatenate({in[0], in[1]}, -1); },
                         {random_tensor({2, 2, 3}, 53), random_tensor({2, 2, 1}, 54)}, {0, 1});
  EXPECT_THROW(concatenate({a, random_tensor({3, 1, 2}, 55)}, 1), InvalidArgument);

  const Tensor x = random_tensor({2, 2, 3, 2}, 56);
  const Tensor p = zero_pad2d(x, 1, 0, 2, 1);
  ASSERT_EQ(p.shape(), (Shape{2, 3, 6, 2}));
  EXPECT_EQ(p.data<float>()[0], 0.0f);
  // x[0, 0, 0, :] lands at p[0, 1, 2, :].
  EXPECT_EQ(p.data<float>()[(1 * 6 + 2) * 2], x.data<float>()[0]);
  expect_gradients_match([](const Inputs& in) { return zero_pad2d(in[0], 1, 0, 2, 1); }, {x}, {0});
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

// The fused relu gives what a relu after the batch norm gives, forward and backward (whose
// gradients the finite-difference tests above check; differences across relu's kink would
// only test the step size).
std::vector<std::vector<float>> gradients_of(const std::function<Tensor(const Inputs&)>& f, const Inputs& in) {
  GradientTape tape;
  for (const Tensor& t : in) tape.watch(t);
  const Tensor y = f(in);
  const Tensor r = testing::random_tensor(y.shape(), 99, 0.5f, 1.5f);
  std::vector<std::vector<float>> out;
  for (const Tensor& g : tape.gradient(reduce_sum(mul(y, r)), std::span<const Tensor>(in))) out.push_back(g.to_vector());
  return out;
}

void expect_same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j) EXPECT_NEAR(a[i][j], b[i][j], 1e-6) << "input " << i << " element " << j;
  }
}

TEST(NormOps, BatchNormWithAFusedReluIsBatchNormThenRelu) {
  const Tensor x = testing::random_tensor({4, 3, 5}, 61, -2.0f, 2.0f);
  const Tensor gamma = testing::random_tensor({5}, 62, 0.5f, 1.5f), beta = testing::random_tensor({5}, 63);
  const Inputs in{x, gamma, beta};
  EXPECT_EQ(batch_norm(x, gamma, beta, 1e-3f, false, nullptr, nullptr, /*relu=*/true).to_vector(),
            relu(batch_norm(x, gamma, beta, 1e-3f, false)).to_vector());
  expect_same(gradients_of([](const Inputs& v) { return batch_norm(v[0], v[1], v[2], 1e-3f, false, nullptr, nullptr, true); }, in),
              gradients_of([](const Inputs& v) { return relu(batch_norm(v[0], v[1], v[2], 1e-3f, false)); }, in));
  const Tensor mean = testing::random_tensor({5}, 64), variance = testing::random_tensor({5}, 65, 0.5f, 2.0f);
  EXPECT_EQ(batch_norm_inference(x, mean, variance, gamma, beta, 1e-3f, true).to_vector(),
            relu(batch_norm_inference(x, mean, variance, gamma, beta, 1e-3f)).to_vector());
  expect_same(
      gradients_of([=](const Inputs& v) { return batch_norm_inference(v[0], mean, variance, v[1], v[2], 1e-3f, true); }, in),
      gradients_of([=](const Inputs& v) { return relu(batch_norm_inference(v[0], mean, variance, v[1], v[2], 1e-3f)); }, in));
}

}  // namespace
}  // namespace dtrain
