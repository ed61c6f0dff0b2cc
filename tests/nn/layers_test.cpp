#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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
    set_global_policy("mixed_float16");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'mixed_float16' is not supported"), std::string::npos) << e.what();
  }
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
