#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/error_message.h"
#include "common/gradcheck.h"
#include "dtrain/nn/layers.h"

namespace dtrain::nn {
namespace {

using dtrain::testing::message_of;

TEST(DTypePolicy, LayersTakeTheGlobalPolicyWhenCreated) {
  Dense before(3, "relu", {.seed = 1});
  {
    ScopedGlobalPolicy mixed("mixed_bfloat16");
    Dense d(3, "relu", {.seed = 1});
    EXPECT_EQ(d.dtype_policy().name, "mixed_bfloat16");
    EXPECT_EQ(d.dtype_policy().compute_dtype, DType::bf16);
    const Tensor x = testing::random_tensor({5, 4}, 1);
    const Tensor y = d(x);
    EXPECT_EQ(y.dtype(), DType::f32);
    EXPECT_EQ(d.kernel().value().dtype(), DType::f32);  // variables stay float32
    // The same weights in float32 give nearly, not exactly, the same output.
    Dense f(3, "relu", {.seed = 1});
    f.set_dtype_policy("float32");
    const auto a = y.to_vector(), c = f(x).to_vector();
    float diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - c[i]));
    EXPECT_GT(diff, 0.0f);
    EXPECT_LT(diff, 0.05f);
    try {
      d.set_dtype_policy("float32");
      FAIL();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("cannot change after it is built"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(before.dtype_policy().name, "float32");
  EXPECT_EQ(global_policy().name, "float32");
  try {
    set_global_policy("mixed_float8");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'mixed_float8' is not supported"), std::string::npos) << e.what();
  }
  {
    ScopedGlobalPolicy half("mixed_float16");
    EXPECT_EQ(Dense(2).dtype_policy().compute_dtype, DType::f16);
    EXPECT_EQ(global_policy().name, "mixed_float16");
  }
  EXPECT_EQ(global_policy().name, "float32");
}

TEST(Dense, BuildsFromFirstInputAndInfersShapes) {
  Dense d(3, "relu", {.seed = 1});
  EXPECT_FALSE(d.built());
  Tensor y = d(testing::random_tensor({5, 4}, 1));
  EXPECT_TRUE(d.built());
  EXPECT_EQ(y.shape(), Shape({5, 3}));
  EXPECT_EQ(d.kernel().shape(), Shape({4, 3}));
  EXPECT_EQ(d.bias()->shape(), Shape({3}));
  EXPECT_EQ(d.count_params(), 15);
  EXPECT_EQ(d.kernel().name(), "dense/kernel");
  EXPECT_EQ(d.compute_output_shape({7, 2, 4}), Shape({7, 2, 3}));
  // Another batch size is fine; another feature count is not, and the error names the layer.
  EXPECT_EQ(d(testing::random_tensor({2, 4}, 2)).shape(), Shape({2, 3}));
  try {
    d(testing::random_tensor({2, 5}, 3));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'dense' (Dense)"), std::string::npos) << e.what();
  }
}

TEST(Dense, GlorotUniformLimitAndZeroBias) {
  Dense d(200, "", {.seed = 2});
  d.build({1, 300});
  const float limit = std::sqrt(6.0f / (300 + 200));
  float lo = 1, hi = -1;
  double mean = 0;
  for (float v : d.kernel().value().to_vector()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    mean += v;
  }
  EXPECT_GE(lo, -limit);
  EXPECT_LE(hi, limit);
  EXPECT_LT(lo, -0.95f * limit);  // the whole range is used
  EXPECT_GT(hi, 0.95f * limit);
  EXPECT_NEAR(mean / 60000, 0.0, 0.002);
  for (float v : d.bias()->value().to_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(Dense, SameSeedSameWeights) {
  Dense a(4, "", {.seed = 9}), b(4, "", {.seed = 9});
  a.build({1, 3});
  b.build({1, 3});
  EXPECT_EQ(a.kernel().value().to_vector(), b.kernel().value().to_vector());
}

TEST(Dense, ComputesActivationOfAffineMap) {
  Dense d(2, "sigmoid", {.kernel_initializer = "ones", .bias_initializer = "ones"});
  Tensor y = d(Tensor::from_vector({1, 3}, {1, 2, -4}));
  const float z = 1 + 2 - 4 + 1;
  EXPECT_NEAR(y.to_vector()[0], 1 / (1 + std::exp(-z)), 1e-6);
  Dense s(3, "softmax", {.use_bias = false, .kernel_initializer = "ones"});
  Tensor p = s(Tensor::from_vector({1, 2}, {1, 2}));
  for (float v : p.to_vector()) EXPECT_NEAR(v, 1.0f / 3, 1e-6);
}

TEST(Dense, RejectsBadConfiguration) {
  EXPECT_THROW(Dense(0), InvalidArgument);
  EXPECT_THROW(Dense(3, "swishy"), InvalidArgument);
  EXPECT_THROW(Dense(3, "", {.kernel_initializer = "lecun_fancy"}), InvalidArgument);
  Dense d(3);
  EXPECT_THROW(d(Tensor::zeros({4})), InvalidArgument);  // rank 1: no batch axis
}

TEST(Dense, GradientsReachKernelAndBias) {
  Dense d(2, "tanh", {.seed = 3});
  Tensor x = testing::random_tensor({4, 3}, 4);
  GradientTape tape;
  Tensor loss = reduce_sum(d(x, true));
  auto vars = d.trainable_variables();
  auto grads = tape.gradient(loss, vars);
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].shape(), Shape({3, 2}));
  EXPECT_EQ(grads[1].shape(), Shape({2}));
}

// layer.losses: l1 * Σ|w| + l2 * Σw² for each regularized weight, the activity penalty of
// the last call divided by its rows; their gradients are Keras's l1 * sign(w) + 2 * l2 * w
// (the activity one reaching the kernel through the output).
TEST(Regularizers, PenaltiesAndTheirGradients) {
  Dense d(2, "linear", {.seed = 3, .kernel_regularizer = Regularizer::L1L2(0.02f, 0.3f),
                        .bias_regularizer = Regularizer::from_name("l2")});
  d.set_activity_regularizer(Regularizer::L1(0.5f));
  d.build(Shape{4, 3});
  d.bias()->assign(Tensor::from_vector({2}, {0.25f, -0.5f}));
  const std::vector<float> k = d.kernel().value().to_vector();
  double l1 = 0, l2 = 0;
  for (float v : k) l1 += std::fabs(v), l2 += double(v) * v;
  std::vector<Tensor> losses = d.losses();
  ASSERT_EQ(losses.size(), 2u);  // no call yet: no activity penalty
  EXPECT_NEAR(losses[0].item(), 0.02 * l1 + 0.3 * l2, 1e-6);
  EXPECT_NEAR(losses[1].item(), 0.01 * (0.0625 + 0.25), 1e-7);

  const Tensor x = testing::random_tensor({4, 3}, 9);
  GradientTape tape;
  const Tensor y = d(x, true);
  losses = d.losses();
  ASSERT_EQ(losses.size(), 3u);
  double activity = 0;
  for (float v : y.to_vector()) activity += std::fabs(v);
  EXPECT_NEAR(losses[2].item(), 0.5 * activity / 4, 1e-6);

  Variable* vars[] = {&d.kernel()};
  const Tensor g = tape.gradient(add_n(losses), vars)[0];
  // d(activity)/dk[i][j] = 0.5 / 4 * Σ_rows sign(y[r][j]) * x[r][i]
  const std::vector<float> xv = x.to_vector(), yv = y.to_vector(), gv = g.to_vector();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      double expected = 0.02 * (k[i * 2 + j] > 0 ? 1 : -1) + 0.6 * k[i * 2 + j];
      for (int r = 0; r < 4; ++r) expected += 0.5 / 4 * (yv[r * 2 + j] > 0 ? 1 : -1) * xv[r * 3 + i];
      EXPECT_NEAR(gv[i * 2 + j], expected, 1e-5) << i << "," << j;
    }
}

TEST(Activation, AppliesByName) {
  Activation a("relu");
  EXPECT_EQ(a(Tensor::from_vector({1, 3}, {-1, 0, 2})).to_vector(), (std::vector<float>{0, 0, 2}));
  EXPECT_THROW(Activation("nope"), InvalidArgument);
}

TEST(Dropout, OnlyWhileTrainingAndSeeded) {
  Tensor x = Tensor::full({4, 1000}, 1.0f);
  Dropout d(0.5f, 7);
  EXPECT_EQ(d(x, false).to_vector(), x.to_vector());
  const auto first = d(x, true).to_vector();
  const auto second = d(x, true).to_vector();
  EXPECT_NE(first, second);  // a fresh mask each call
  Dropout again(0.5f, 7);
  EXPECT_EQ(again(x, true).to_vector(), first);  // same seed, same masks
  int zeros = 0;
  for (float v : first) zeros += v == 0.0f;
  EXPECT_NEAR(zeros / 4000.0, 0.5, 0.05);
  EXPECT_THROW(Dropout(1.0f), InvalidArgument);
}

TEST(Rescaling, ScalesBytesAndFloatsAndPassesGradients) {
  Tensor bytes = Tensor::empty({2, 3}, DType::u8);
  const std::uint8_t raw[] = {0, 1, 127, 128, 254, 255};
  std::copy(std::begin(raw), std::end(raw), bytes.data<std::uint8_t>());
  Rescaling r(1.0f / 255, -0.5f);
  Tensor y = r(bytes);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.shape(), Shape({2, 3}));
  const std::vector<float> v = y.to_vector();
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(v[static_cast<std::size_t>(i)], raw[i] * (1.0f / 255) - 0.5f) << i;
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Rescaling g(-3.0f, 2.0f);
        return g(in[0]);
      },
      {testing::random_tensor({3, 4}, 6)}, {0});
  Rescaling again(2.0f, 0.0f, "pixels");
  const std::string m = message_of([&] { again(Tensor::from_vector({2}, std::vector<std::int32_t>{1, 2})); });
  EXPECT_NE(m.find("layer 'pixels' (Rescaling): expects float32 or uint8 inputs, got int32"), std::string::npos) << m;
  EXPECT_THROW(Rescaling{INFINITY}, InvalidArgument);
}

TEST(Pooling2D, RejectsAPoolSizeOrStrideOfZeroNamingTheLayer) {
  // Checked while only the pooling part of the layer is built: its name still comes out.
  EXPECT_NE(message_of([] { MaxPooling2D({0, 2}, std::nullopt, "valid", "pool"); })
                .find("layer 'pool' (MaxPooling2D): pool_size must be positive, got (0, 2)"),
            std::string::npos);
  EXPECT_NE(message_of([] { AveragePooling2D({2, 2}, Pair{0, 1}); })
                .find("(AveragePooling2D): strides must be positive, got (0, 1)"),
            std::string::npos);
}

TEST(Conv2D, ADepthwiseLayersChecksNameItsOwnClass) {
  EXPECT_NE(message_of([] { DepthwiseConv2D(Pair{0, 3}, 1, {.name = "dw"}); })
                .find("layer 'dw' (DepthwiseConv2D): kernel_size must be positive, got (0, 3)"),
            std::string::npos);
  EXPECT_NE(message_of([] { Conv2D(4, Pair{0, 3}, {.name = "c"}); }).find("layer 'c' (Conv2D): kernel_size"),
            std::string::npos);
}

// A stride past the image takes its first window alone, as Keras computes it; oneDNN
// refuses such strides, so they reach it as the image's extent.
TEST(Conv2D, AStridePastTheImageTakesTheFirstWindow) {
  const Tensor x = testing::random_tensor({2, 5, 4, 3}, 21);
  for (const std::int64_t stride : {std::int64_t{5}, std::int64_t{1} << 40}) {
    Conv2D conv(2, 2, {.strides = {stride, stride}, .seed = 22});
    MaxPooling2D pool({2, 2}, Pair{stride, stride});
    const Tensor y = conv(x), p = pool(x);
    ASSERT_EQ(y.shape(), Shape({2, 1, 1, 2})) << stride;
    ASSERT_EQ(p.shape(), Shape({2, 1, 1, 3})) << stride;
    // The first window by hand: the kernel over the 2x2 pixels at the corner, plus the bias.
    const std::vector<float> xv = x.to_vector(), k = conv.kernel().value().to_vector(), yv = y.to_vector();
    for (int n = 0; n < 2; ++n)
      for (int f = 0; f < 2; ++f) {
        double want = conv.bias()->value().to_vector()[f];
        float largest = -INFINITY;
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j)
            for (int c = 0; c < 3; ++c) {
              const float v = xv[((n * 5 + i) * 4 + j) * 3 + c];
              want += static_cast<double>(v) * k[((i * 2 + j) * 3 + c) * 2 + f];
              if (c == f) largest = std::max(largest, v);
            }
        EXPECT_NEAR(yv[n * 2 + f], want, 1e-5) << "stride " << stride;
        EXPECT_EQ(p.to_vector()[n * 3 + f], largest) << "stride " << stride;
      }
  }
}

// Under "same", a window wider than every output's reach pools the whole image at every
// output: 2^28 gives what 64 gives (each channel's largest value, or its mean), at once.
TEST(Pooling2D, AWindowPastTheImageUnderSamePoolsTheWholeImage) {
  const Tensor x = testing::random_tensor({2, 5, 4, 3}, 31);
  const std::vector<float> xv = x.to_vector();
  const Pair huge{std::int64_t{1} << 28, std::int64_t{1} << 28};
  for (const Pair strides : {Pair{1, 1}, Pair{2, 3}}) {
    MaxPooling2D max_huge(huge, strides, "same"), max_wide({64, 64}, strides, "same");
    EXPECT_THROW(max_huge.compute_output_shape({1, 0, 4, 3}), InvalidArgument);  // no pixels to pool
    AveragePooling2D avg_huge(huge, strides, "same"), avg_wide({64, 64}, strides, "same");
    const Tensor m = max_huge(x), a = avg_huge(x);
    EXPECT_EQ(m.to_vector(), max_wide(x).to_vector());
    EXPECT_EQ(a.to_vector(), avg_wide(x).to_vector());
    const std::vector<float> mv = m.to_vector(), av = a.to_vector();
    const std::int64_t per_image = m.numel() / 2;
    for (std::int64_t i = 0; i < m.numel(); ++i) {
      const std::int64_t n = i / per_image, c = i % 3;
      float largest = -INFINITY;
      double sum = 0;
      for (std::int64_t p = 0; p < 20; ++p) {
        largest = std::max(largest, xv[(n * 20 + p) * 3 + c]);
        sum += xv[(n * 20 + p) * 3 + c];
      }
      EXPECT_EQ(mv[i], largest) << i;
      EXPECT_NEAR(av[i], sum / 20, 1e-5) << i;
    }
  }
}

// Settings oneDNN refuses (a dilation far past the image under "same") name the layer.
TEST(Conv2D, WhatOneDnnRefusesNamesTheLayer) {
  Conv2D conv(2, 3, {.padding = "same", .dilation_rate = {std::int64_t{1} << 40, 1}, .name = "wide"});
  const std::string m = message_of([&] { conv(testing::random_tensor({1, 4, 4, 1}, 3)); });
  EXPECT_NE(m.find("layer 'wide' (Conv2D) on [1, 4, 4, 1]: oneDNN could not build a primitive"), std::string::npos) << m;
}

TEST(Reshape, ATargetShapeWithTwoUnknownsIsNamedAsWritten) {
  EXPECT_NE(message_of([] { Reshape({-1, -1, 1}, "r"); })
                .find("layer 'r' (Reshape): target_shape may hold one -1, got [-1, -1, 1]"),
            std::string::npos);
  EXPECT_NE(message_of([] { Reshape({-1, 0}); }).find("must be positive (or one -1), got [-1, 0]"), std::string::npos);
  Reshape r({-1, 5});
  EXPECT_NE(message_of([&] { r.compute_output_shape({2, 8}); }).find("to [-1, 5]"), std::string::npos);
}

TEST(Flatten, KeepsBatchAxis) {
  Flatten f;
  Tensor x = testing::random_tensor({2, 3, 4}, 5);
  Tensor y = f(x);
  EXPECT_EQ(y.shape(), Shape({2, 12}));
  EXPECT_EQ(y.to_vector(), x.to_vector());
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Flatten g;
        return g(in[0]);
      },
      {x}, {0});
}

}  // namespace
}  // namespace dtrain::nn

namespace dtrain::nn {
namespace {

// Conv1D is Conv2D over [batch, 1, steps, channels] with the kernel [K, C, F]: the same
// output as a hand-written sum, and gradients that match finite differences.
TEST(Conv1D, ConvolvesSequencesAsKerasAndPassesGradients) {
  const Tensor x = testing::random_tensor({2, 7, 3}, 41);
  Conv1D conv(4, 3, {.strides = {1, 2}, .padding = "same", .seed = 42});
  const Tensor y = conv(x);
  ASSERT_EQ(y.shape(), Shape({2, 4, 4}));
  ASSERT_EQ(conv.kernel().shape(), Shape({3, 3, 4}));
  const std::vector<float> xv = x.to_vector(), k = conv.kernel().value().to_vector(), yv = y.to_vector();
  // "same" with stride 2 over 7 steps: outputs at steps 0, 2, 4, 6 with one zero before.
  for (int n = 0; n < 2; ++n)
    for (int t = 0; t < 4; ++t)
      for (int f = 0; f < 4; ++f) {
        double want = conv.bias()->value().to_vector()[f];
        for (int i = 0; i < 3; ++i) {
          const int step = 2 * t - 1 + i;
          if (step < 0 || step >= 7) continue;
          for (int c = 0; c < 3; ++c) want += static_cast<double>(xv[(n * 7 + step) * 3 + c]) * k[(i * 3 + c) * 4 + f];
        }
        EXPECT_NEAR(yv[(n * 4 + t) * 4 + f], want, 1e-5) << n << " " << t << " " << f;
      }
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Conv1D c(2, 2, {.dilation_rate = {1, 2}, .seed = 43});
        return c(in[0]);
      },
      {testing::random_tensor({2, 6, 3}, 44)}, {0});
  // "causal": as many outputs as steps, each seeing no later step.
  Conv1D causal(3, 3, {.padding = "causal", .dilation_rate = {1, 2}, .seed = 45});
  const Tensor seq = testing::random_tensor({1, 9, 2}, 46);
  std::vector<float> later = seq.to_vector();
  for (std::size_t i = 12; i < later.size(); ++i) later[i] += 1.0f;  // steps 6 to 8 change
  const std::vector<float> a = causal(seq).to_vector(), b = causal(Tensor::from_vector({1, 9, 2}, later)).to_vector();
  ASSERT_EQ(a.size(), 27u);
  for (std::size_t i = 0; i < 18; ++i) EXPECT_EQ(a[i], b[i]) << "output " << i / 3 << " saw a later step";
  EXPECT_NE(a[18], b[18]);
  EXPECT_EQ(causal.padding(), "causal");
  EXPECT_NE(message_of([] { Conv1D c(2, 2, {.name = "c1"}); c(Tensor::zeros({2, 3, 3, 1})); })
                .find("layer 'c1' (Conv1D): expects sequences [batch, steps, channels], got [2, 3, 3, 1]"),
            std::string::npos);
}

TEST(Pooling1D, PoolsEachChannelAlongTheSteps) {
  const Tensor x = Tensor::from_vector({1, 5, 2}, {1, 10, 5, 20, 3, 30, 2, 40, 9, 50});
  MaxPooling1D max_pool(2);
  EXPECT_EQ(max_pool(x).shape(), Shape({1, 2, 2}));
  EXPECT_EQ(max_pool(x).to_vector(), (std::vector<float>{5, 20, 3, 40}));
  AveragePooling1D mean_pool(2, 1, "same");
  EXPECT_EQ(mean_pool(x).shape(), Shape({1, 5, 2}));
  EXPECT_FLOAT_EQ(mean_pool(x).to_vector()[9], 50.0f);  // the last window: one step
  EXPECT_EQ(max_pool.class_name(), "MaxPooling1D");
}

TEST(Normalization, AdaptsToTheDataAndInverts) {
  const Tensor data = Tensor::from_vector({4, 2}, {1, 10, 3, 10, 5, 30, 7, 30});
  Normalization norm;
  norm.adapt(data);
  EXPECT_EQ(norm.mean(), (std::vector<float>{4, 20}));
  EXPECT_EQ(norm.variance(), (std::vector<float>{5, 100}));
  const std::vector<float> y = norm(data).to_vector();
  EXPECT_NEAR(y[0], -3 / std::sqrt(5.0f), 1e-6);
  EXPECT_NEAR(y[1], -1.0f, 1e-6);
  Normalization back(std::vector<float>{4, 20}, std::vector<float>{5, 100}, true);
  EXPECT_NEAR(back(norm(data)).to_vector()[6], 7.0f, 1e-5);
  // A constant feature (variance 0) divides by 1e-7's floor, not by zero.
  Normalization flat(std::vector<float>{2}, std::vector<float>{0});
  EXPECT_TRUE(std::isfinite(flat(Tensor::from_vector({1, 1}, {2.5f})).to_vector()[0]));
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Normalization n(std::vector<float>{1, -1, 0}, std::vector<float>{4, 0.25f, 9});
        return n(in[0]);
      },
      {testing::random_tensor({3, 3}, 45)}, {0});
  EXPECT_THROW(Normalization(std::vector<float>{1}, std::nullopt), InvalidArgument);
  EXPECT_NE(message_of([&] { Normalization n(std::vector<float>{1, 2}, std::vector<float>{1, 1}); n(Tensor::zeros({2, 3})); })
                .find("its statistics have 2 features, the input [2, 3]"),
            std::string::npos);
}

// Keras's axis: statistics per index of the kept axes (the channels of [N, C, L] here,
// or each (C, L) pair), or one pair for every value (none kept).
TEST(Normalization, KeepsTheAxesGivenAndReducesTheOthers) {
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i * i % 7) + (i / 3 % 2 ? 10.0f : 0.0f);
  const Tensor data = Tensor::from_vector({4, 2, 3}, v);
  const auto stats_over = [&](const std::function<std::size_t(std::size_t)>& feature, std::size_t features) {
    std::vector<double> sum(features, 0.0), squares(features, 0.0), count(features, 0.0);
    for (std::size_t i = 0; i < v.size(); ++i) sum[feature(i)] += v[i], count[feature(i)] += 1;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double d = v[i] - sum[feature(i)] / count[feature(i)];
      squares[feature(i)] += d * d;
    }
    std::vector<float> mean, variance;
    for (std::size_t j = 0; j < features; ++j) {
      mean.push_back(static_cast<float>(sum[j] / count[j]));
      variance.push_back(static_cast<float>(squares[j] / count[j]));
    }
    return std::pair{mean, variance};
  };
  Normalization channels(std::nullopt, std::nullopt, false, "channels", {1});
  channels.adapt(data);
  const auto [mean1, var1] = stats_over([](std::size_t i) { return i / 3 % 2; }, 2);
  EXPECT_EQ(channels.mean(), mean1);
  EXPECT_EQ(channels.variance(), var1);
  const std::vector<float> y = channels(data).to_vector();
  EXPECT_NEAR(y[4], (v[4] - mean1[1]) / std::sqrt(var1[1]), 1e-5);
  EXPECT_EQ(channels.variables()[0]->shape(), (Shape{2}));
  Normalization pairs(std::nullopt, std::nullopt, false, "pairs", {-2, -1});
  pairs.adapt(data);
  EXPECT_EQ(pairs.mean(), stats_over([](std::size_t i) { return i % 6; }, 6).first);
  EXPECT_EQ(pairs(data).shape(), data.shape());
  EXPECT_EQ(pairs.variables()[0]->shape(), (Shape{2, 3}));
  Normalization all(std::nullopt, std::nullopt, false, "all", {});
  all.adapt(data);
  EXPECT_EQ(all.mean(), stats_over([](std::size_t) { return 0; }, 1).first);
  EXPECT_NEAR(all(data).to_vector()[23], (v[23] - all.mean()[0]) / std::sqrt(all.variance()[0]), 1e-5);
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Normalization n(std::vector<float>{1, -1}, std::vector<float>{4, 0.25f}, false, "n", {1});
        return n(in[0]);
      },
      {testing::random_tensor({3, 2, 2}, 46)}, {0});
  EXPECT_THROW(Normalization(std::nullopt, std::nullopt, false, "batch", {0}), InvalidArgument);
  EXPECT_NE(message_of([&] { Normalization n(std::nullopt, std::nullopt, false, "far", {3}); n(data); })
                .find("axis 3 is outside inputs of rank 3"),
            std::string::npos);
  EXPECT_NE(message_of([&] { Normalization n(std::nullopt, std::nullopt, false, "batch", {-3}); n.adapt(data); })
                .find("axis -3 is the batch axis of inputs of rank 3"),
            std::string::npos);
}

TEST(CategoryEncoding, OneHotMultiHotAndCount) {
  const Tensor ids = Tensor::from_vector({2, 3}, std::vector<std::int32_t>{0, 2, 2, 3, 1, 1});
  EXPECT_EQ(CategoryEncoding(4, "multi_hot")(ids).to_vector(), (std::vector<float>{1, 0, 1, 0, 0, 1, 0, 1}));
  EXPECT_EQ(CategoryEncoding(4, "count")(ids).to_vector(), (std::vector<float>{1, 0, 2, 0, 0, 2, 0, 1}));
  const Tensor one = CategoryEncoding(4, "one_hot")(Tensor::from_vector({3}, std::vector<std::int32_t>{3, 0, 1}));
  EXPECT_EQ(one.shape(), Shape({3, 4}));
  EXPECT_EQ(one.to_vector()[3], 1.0f);
  EXPECT_NE(message_of([&] { CategoryEncoding(2, "count", "enc")(ids); })
                .find("layer 'enc' (CategoryEncoding): id 2.000000 (element 1) is not in [0, 2)"),
            std::string::npos);
  EXPECT_THROW(CategoryEncoding(3, "tf_idf"), InvalidArgument);
}

// Augmentations: the identity (or the centre) at inference; while training, each image
// flipped or cropped as a whole, the same for a seed, different from call to call, and the
// gradient goes back to the pixels taken.
TEST(Augmentation, FlipsAndCropsWholeImagesWhileTrainingOnly) {
  const Tensor x = testing::random_tensor({8, 4, 5, 2}, 46);
  RandomFlip flip("horizontal", 7);
  EXPECT_EQ(flip(x, false).to_vector(), x.to_vector());
  const Tensor flipped = flip(x, true);
  const std::vector<float> xv = x.to_vector(), fv = flipped.to_vector();
  int mirrored = 0;
  for (int n = 0; n < 8; ++n) {
    bool same = true, mirror = true;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 5; ++j)
        for (int c = 0; c < 2; ++c) {
          const float out = fv[((n * 4 + i) * 5 + j) * 2 + c];
          same &= out == xv[((n * 4 + i) * 5 + j) * 2 + c];
          mirror &= out == xv[((n * 4 + i) * 5 + (4 - j)) * 2 + c];
        }
    EXPECT_TRUE(same || mirror) << "image " << n;
    mirrored += mirror && !same;
  }
  EXPECT_GT(mirrored, 0);
  EXPECT_LT(mirrored, 8);
  RandomFlip again("horizontal", 7);
  EXPECT_EQ(again(x, true).to_vector(), fv);
  EXPECT_NE(again(x, true).to_vector(), fv);  // the next call draws anew

  RandomCrop crop(2, 3, 9);
  const Tensor centre = crop(x, false);
  ASSERT_EQ(centre.shape(), Shape({8, 2, 3, 2}));
  EXPECT_EQ(centre.to_vector()[0], xv[((0 * 4 + 1) * 5 + 1) * 2]);
  const Tensor cut = crop(x, true);
  ASSERT_EQ(cut.shape(), Shape({8, 2, 3, 2}));
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        RandomCrop c(2, 2, 3);
        return c(in[0], true);
      },
      {testing::random_tensor({2, 3, 3, 1}, 47)}, {0});
  EXPECT_NE(message_of([&] { RandomCrop(5, 5, 1, "rc")(x, true); }).find("crops 5 x 5 out of images [8, 4, 5, 2]"),
            std::string::npos);
  // One image [H, W, C] at a time, of any size: a smaller one later is named, not cropped.
  RandomCrop single(3, 3, 2, "single");
  EXPECT_EQ(single(testing::random_tensor({4, 5, 1}, 48), true).shape(), Shape({3, 3, 1}));
  EXPECT_NE(message_of([&] { single(testing::random_tensor({2, 5, 1}, 49), true); }).find("crops 3 x 3 out of images"),
            std::string::npos);
}

// A quarter turn moves every pixel exactly (output (y, x) reads input (x, W-1-y) for a
// square image), the identity at inference and at a turn of 0, the fill where nothing is
// read, and bilinear reads whose gradient matches finite differences.
TEST(Augmentation, RotationTurnsImagesAboutTheirCentre) {
  const Tensor x = testing::random_tensor({2, 4, 4, 3}, 51);
  RandomRotation rotation(-0.2, 0.2, "reflect", "bilinear", 5);
  EXPECT_EQ(rotation(x, false).to_vector(), x.to_vector());
  const std::vector<float> xv = x.to_vector(), same = rotation.rotate(x, {0.0, 0.0}).to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(same[i], xv[i], 1e-6);
  const std::vector<float> quarter = rotation.rotate(x, {0.25, 0.25}).to_vector();
  for (int n = 0; n < 2; ++n)
    for (int y = 0; y < 4; ++y)
      for (int c = 0; c < 3; ++c)
        for (int xx = 0; xx < 4; ++xx)
          EXPECT_NEAR(quarter[((n * 4 + y) * 4 + xx) * 3 + c], xv[((n * 4 + xx) * 4 + (3 - y)) * 3 + c], 1e-5);
  RandomRotation constant(0.125, 0.125, "constant", "bilinear", 6, 7.0f);
  const Tensor ones = Tensor::full({1, 9, 9, 1}, 1.0f);
  const std::vector<float> eighth = constant.rotate(ones, {0.125}).to_vector();
  EXPECT_NEAR(eighth[0], 7.0f, 1e-5);        // a corner reads outside the turned image
  EXPECT_NEAR(eighth[4 * 9 + 4], 1.0f, 1e-5);  // the centre stays
  for (const char* mode : {"reflect", "wrap", "nearest", "constant"})
    testing::expect_gradients_match(
        [mode](const std::vector<Tensor>& in) {
          RandomRotation r(-0.1, 0.1, mode, "bilinear", 8);
          return r.rotate(in[0], {0.07, -0.04});
        },
        {testing::random_tensor({2, 5, 4, 2}, 52)}, {0});
  const Tensor turned = rotation(x, true);
  EXPECT_EQ(turned.shape(), x.shape());
  EXPECT_NE(turned.to_vector(), x.to_vector());
  EXPECT_THROW(RandomRotation(0.2, 0.1), InvalidArgument);
  EXPECT_THROW(RandomRotation(-0.1, 0.1, "mirror"), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::nn
