// Every differentiable op against central finite differences.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "common/gradcheck.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::GradcheckOptions;
using testing::random_away_from;
using testing::random_tensor;
using Inputs = std::vector<Tensor>;

// x * x with a wrong backward (x instead of 2x): the checker must reject it.
Tensor wrong_square(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape());
  kernels::backend().binary(kernels::Binary::mul, x, x, y);
  const Tensor* inputs[] = {&x};
  if (GradientTape::should_record(inputs))
    GradientTape::record(inputs, y, [x](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = Tensor::empty(dy.shape());
      kernels::backend().binary(kernels::Binary::mul, dy, x, dx);
      ctx.add(0, dx);
    });
  return y;
}

TEST(Gradcheck, TheCheckerRejectsAWrongBackward) {
  EXPECT_FATAL_FAILURE(expect_gradients_match([](const Inputs& in) { return wrong_square(in[0]); },
                                              {random_tensor({5}, 1, 0.5f, 1.5f)}, {0}),
                       "element 0");
  // And accepts the right one.
  expect_gradients_match([](const Inputs& in) { return square(in[0]); }, {random_tensor({5}, 1, 0.5f, 1.5f)}, {0});
}

TEST(Gradcheck, Matmul) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = random_tensor(ta ? Shape{4, 3} : Shape{3, 4}, 1);
      Tensor b = random_tensor(tb ? Shape{5, 4} : Shape{4, 5}, 2);
      expect_gradients_match([=](const Inputs& in) { return matmul(in[0], in[1], ta, tb); }, {a, b}, {0, 1});
    }
}

TEST(Gradcheck, DenseEachActivation) {
  for (Activation act : {Activation::linear, Activation::relu, Activation::sigmoid, Activation::tanh, Activation::gelu}) {
    SCOPED_TRACE(static_cast<int>(act));
    Tensor x = random_tensor({5, 4}, 3);
    Tensor w = random_tensor({4, 3}, 4);
    Tensor b = random_tensor({3}, 5);
    if (act == Activation::relu) {
      // Keep pre-activations away from relu's kink.
      b = Tensor::from_vector({3}, {0.7f, -0.9f, 0.3f});
    }
    expect_gradients_match([=](const Inputs& in) { return dense(in[0], in[1], in[2], act); }, {x, w, b}, {0, 1, 2});
  }
}

TEST(Gradcheck, DenseWithoutBiasOnRank3Input) {
  Tensor x = random_tensor({2, 3, 4}, 6);
  Tensor w = random_tensor({4, 2}, 7);
  expect_gradients_match([](const Inputs& in) { return dense(in[0], in[1], Tensor(), Activation::tanh); }, {x, w},
                         {0, 1});
}

// Mixed precision: the matmuls read bfloat16 copies of their inputs and accumulate in
// float32, so forward and gradients equal float32 on inputs rounded to bfloat16 (with an
// upstream gradient that bfloat16 holds exactly), and differ from float32 on the originals.
TEST(Gradcheck, MixedPrecisionDenseIsFloat32OnRoundedInputs) {
  auto rounded = [](const Tensor& t) { return t.astype(DType::bf16).astype(DType::f32); };
  auto max_abs_diff = [](const Tensor& a, const Tensor& b) {
    const auto u = a.to_vector(), v = b.to_vector();
    float m = 0;
    for (size_t i = 0; i < u.size(); ++i) m = std::max(m, std::fabs(u[i] - v[i]));
    return m;
  };
  const Tensor x = random_tensor({9, 33}, 31), w = random_tensor({33, 7}, 32), b = random_tensor({7}, 33);
  Tensor dy = Tensor::empty({9, 7});
  Generator g(34);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = static_cast<float>(g.below(17)) / 8.0f - 1.0f;
  for (Activation act : {Activation::linear, Activation::relu}) {
    SCOPED_TRACE(static_cast<int>(act));
    auto run = [&](const Tensor& xi, const Tensor& wi, DType compute) {
      Tensor xv = xi.clone(), wv = wi.clone(), bv = b.clone();
      GradientTape tape;
      for (Tensor* t : {&xv, &wv, &bv}) tape.watch(*t);
      Tensor y = dense(xv, wv, bv, act, compute);
      std::vector<Tensor> out{y};
      for (Tensor& grad : tape.gradient(y, std::vector<Tensor>{xv, wv, bv}, dy)) out.push_back(grad);
      return out;
    };
    const auto mixed = run(x, w, DType::bf16), reference = run(rounded(x), rounded(w), DType::f32),
               plain = run(x, w, DType::f32);
    for (size_t k = 0; k < mixed.size(); ++k) {
      EXPECT_EQ(mixed[k].dtype(), DType::f32);
      EXPECT_LE(max_abs_diff(mixed[k], reference[k]), 1e-5f) << "output " << k;
    }
    EXPECT_GT(max_abs_diff(mixed[0], plain[0]), 1e-4f) << "the forward did not run in bfloat16";
  }
  EXPECT_THROW(dense(x, w, b, Activation::linear, DType::i32), InvalidArgument);
}

TEST(Gradcheck, BroadcastingArithmetic) {
  const std::pair<Shape, Shape> shapes[] = {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{4}, {3, 4}}};
  for (const auto& [sa, sb] : shapes) {
    SCOPED_TRACE(sa.to_string() + " " + sb.to_string());
    Tensor a = random_tensor(sa, 8, 0.5f, 1.5f);
    Tensor b = random_tensor(sb, 9, 0.5f, 1.5f);
    expect_gradients_match([](const Inputs& in) { return add(in[0], in[1]); }, {a, b}, {0, 1});
    expect_gradients_match([](const Inputs& in) { return sub(in[0], in[1]); }, {a, b}, {0, 1});
    expect_gradients_match([](const Inputs& in) { return mul(in[0], in[1]); }, {a, b}, {0, 1});
    expect_gradients_match([](const Inputs& in) { return div(in[0], in[1]); }, {a, b}, {0, 1});
  }
}

TEST(Gradcheck, Affine) {
  expect_gradients_match([](const Inputs& in) { return affine(in[0], -2.5f, 0.3f); }, {random_tensor({7}, 10)}, {0});
}

TEST(Gradcheck, UnaryFunctions) {
  const Shape s{3, 5};
  expect_gradients_match([](const Inputs& in) { return relu(in[0]); }, {random_away_from(s, 11, -1, 1, {0.0f})}, {0});
  expect_gradients_match([](const Inputs& in) { return sigmoid(in[0]); }, {random_tensor(s, 12, -3, 3)}, {0});
  expect_gradients_match([](const Inputs& in) { return tanh(in[0]); }, {random_tensor(s, 13, -2, 2)}, {0});
  expect_gradients_match([](const Inputs& in) { return gelu(in[0]); }, {random_tensor(s, 14, -3, 3)}, {0});
  expect_gradients_match([](const Inputs& in) { return gelu(in[0], /*approximate=*/true); }, {random_tensor(s, 19, -3, 3)},
                         {0});
  // The tanh form stays within 1e-3 of the exact one, as the approximation promises.
  const Tensor x = random_tensor({200}, 20, -4, 4);
  const std::vector<float> exact = gelu(x).to_vector(), approx = gelu(x, true).to_vector();
  for (std::size_t i = 0; i < exact.size(); ++i) EXPECT_NEAR(approx[i], exact[i], 1e-3) << i;
  expect_gradients_match([](const Inputs& in) { return exp(in[0]); }, {random_tensor(s, 15, -1, 1)}, {0});
  expect_gradients_match([](const Inputs& in) { return log(in[0]); }, {random_tensor(s, 16, 0.5f, 2)}, {0});
  expect_gradients_match([](const Inputs& in) { return square(in[0]); }, {random_tensor(s, 17)}, {0});
  expect_gradients_match([](const Inputs& in) { return sqrt(in[0]); }, {random_tensor(s, 18, 0.5f, 2)}, {0});
  expect_gradients_match([](const Inputs& in) { return abs(in[0]); }, {random_away_from(s, 19, -1, 1, {0.0f})}, {0});
  expect_gradients_match([](const Inputs& in) { return clip_by_value(in[0], -0.5f, 0.5f); },
                         {random_away_from(s, 20, -1, 1, {-0.5f, 0.5f})}, {0});
}

TEST(Gradcheck, SoftmaxAndLogSoftmax) {
  expect_gradients_match([](const Inputs& in) { return softmax(in[0]); }, {random_tensor({4, 6}, 21, -2, 2)}, {0});
  expect_gradients_match([](const Inputs& in) { return log_softmax(in[0]); }, {random_tensor({4, 6}, 22, -2, 2)}, {0});
}

TEST(Gradcheck, Reductions) {
  Tensor x = random_tensor({3, 4, 2}, 23);
  expect_gradients_match([](const Inputs& in) { return reduce_sum(in[0]); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_mean(in[0]); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_sum(in[0], {1}); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_mean(in[0], {0, -1}, true); }, {x}, {0});
}

// Selection: where (each branch gets the gradient where chosen), slices, gather (rows
// gathered twice add), and max/min (random values: no ties, so the finite differences see
// one maximal element move).
TEST(Gradcheck, WhereSliceGatherMaxMin) {
  const Tensor condition = Tensor::from_vector({2, 3}, std::vector<std::int32_t>{1, 0, 0, 1, 1, 0});
  expect_gradients_match([&](const Inputs& in) { return where(condition, in[0], in[1]); },
                         {random_tensor({2, 3}, 31), random_tensor({2, 3}, 32)}, {0, 1});
  expect_gradients_match([&](const Inputs& in) { return where(condition, in[0], in[1]); },
                         {random_tensor({2, 3}, 33), random_tensor({}, 34)}, {0, 1});
  expect_gradients_match([](const Inputs& in) { return square(slice_axis(in[0], 1, 1, 2)); }, {random_tensor({3, 4, 2}, 35)},
                         {0});
  const Tensor rows = Tensor::from_vector({2, 2}, std::vector<std::int32_t>{2, 0, 2, 1});
  expect_gradients_match([&](const Inputs& in) { return square(gather(in[0], rows, 0)); }, {random_tensor({3, 4}, 36)}, {0});
  expect_gradients_match([&](const Inputs& in) { return square(gather(in[0], rows, 1)); }, {random_tensor({2, 3, 2}, 37)},
                         {0});
  const Tensor per_batch = Tensor::from_vector({2, 3}, std::vector<std::int32_t>{2, 2, 0, 1, 3, 1});
  expect_gradients_match([&](const Inputs& in) { return square(gather(in[0], per_batch, 1, 1)); },
                         {random_tensor({2, 4, 3}, 41)}, {0});
  expect_gradients_match([&](const Inputs& in) { return square(gather(in[0], per_batch, 2, 1)); },
                         {random_tensor({2, 3, 4}, 42)}, {0});
  const Tensor x = random_tensor({3, 4, 2}, 38);
  expect_gradients_match([](const Inputs& in) { return reduce_max(in[0], {}); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_max(in[0], {1}); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_min(in[0], {0, -1}, true); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_prod(in[0], {1}); }, {x}, {0});
  expect_gradients_match([](const Inputs& in) { return reduce_prod(in[0], {0, 2}, true); }, {x}, {0});
}

// A product's gradient is the product of the others, also where some are zero (no division).
TEST(Select, ReduceProdValuesAndGradientAtZeros) {
  const Tensor x = Tensor::from_vector({3, 3}, {2.0f, 3.0f, 4.0f, 0.0f, 5.0f, 6.0f, 0.0f, 7.0f, 0.0f});
  EXPECT_EQ(reduce_prod(x, {1}).to_vector(), (std::vector<float>{24.0f, 0.0f, 0.0f}));
  EXPECT_EQ(reduce_prod(x, {0}, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(reduce_prod(Tensor::zeros({0, 2}), {0}).to_vector(), (std::vector<float>{1.0f, 1.0f}));
  Tensor watched = x;
  GradientTape tape;
  tape.watch(watched);
  const auto g = tape.gradient(reduce_sum(reduce_prod(watched, {1})), {watched});
  EXPECT_EQ(g[0].to_vector(), (std::vector<float>{12.0f, 8.0f, 6.0f, 30.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}));
}

// More tensors than one recorded op takes are joined in groups: the same values, and each
// input's gradient from its own rows.
TEST(Gradcheck, ConcatenateOfManyTensors) {
  expect_gradients_match(
      [](const Inputs& in) {
        std::vector<Tensor> parts;
        for (int i = 0; i < 19; ++i) parts.push_back(affine(in[i % 2], static_cast<float>(i + 1)));
        return square(concatenate(parts, 0));
      },
      {random_tensor({2, 3}, 39), random_tensor({1, 3}, 40)}, {0, 1});
  std::vector<Tensor> rows;
  for (int i = 0; i < 17; ++i) rows.push_back(Tensor::full({1, 2}, static_cast<float>(i)));
  const std::vector<float> joined = concatenate(rows, 0).to_vector();
  ASSERT_EQ(joined.size(), 34u);
  for (int i = 0; i < 17; ++i) EXPECT_EQ(joined[static_cast<std::size_t>(2 * i + 1)], static_cast<float>(i));
}

TEST(Select, ValuesTiesAndErrors) {
  const Tensor x = Tensor::from_vector({2, 3}, {1.0f, 5.0f, 5.0f, -1.0f, 0.0f, -1.0f});
  EXPECT_EQ(reduce_max(x, {1}).to_vector(), (std::vector<float>{5.0f, 0.0f}));
  EXPECT_EQ(reduce_min(x, {}).to_vector(), (std::vector<float>{-1.0f}));
  // Ties share the gradient equally, as TensorFlow's.
  Tensor watched = x;
  GradientTape tape;
  tape.watch(watched);
  const auto g = tape.gradient(reduce_sum(reduce_max(watched, {1})), {watched});
  EXPECT_EQ(g[0].to_vector(), (std::vector<float>{0.0f, 0.5f, 0.5f, 0.0f, 1.0f, 0.0f}));
  const Tensor picked = gather(x, Tensor::from_vector({3}, std::vector<std::int32_t>{1, 1, 0}), 0);
  EXPECT_EQ(picked.shape(), (Shape{3, 3}));
  EXPECT_EQ(picked.to_vector()[6], 1.0f);
  EXPECT_THROW(gather(x, Tensor::from_vector({1}, std::vector<std::int32_t>{2}), 0), InvalidArgument);
  // batch_dims 1: row b of the indices picks from row b of x (TensorFlow's per-example take).
  const Tensor taken = gather(x, Tensor::from_vector({2, 2}, std::vector<std::int32_t>{2, 0, 1, 1}), 1, 1);
  EXPECT_EQ(taken.to_vector(), (std::vector<float>{5.0f, 1.0f, 0.0f, 0.0f}));
  EXPECT_THROW(gather(x, Tensor::from_vector({3, 1}, std::vector<std::int32_t>{0, 0, 0}), 1, 1), InvalidArgument);
  EXPECT_THROW(gather(x, Tensor::from_vector({2, 1}, std::vector<std::int32_t>{0, 0}), 0, 1), InvalidArgument);
  EXPECT_EQ(slice_axis(x, -1, 1, 2).to_vector(), (std::vector<float>{5.0f, 5.0f, 0.0f, -1.0f}));
  EXPECT_THROW(slice_axis(x, 1, 2, 2), InvalidArgument);
  EXPECT_THROW(where(Tensor::zeros({2}, DType::i32), x, x), InvalidArgument);
}

TEST(Gradcheck, Reshape) {
  expect_gradients_match([](const Inputs& in) { return tanh(reshape(in[0], {6, 2})); }, {random_tensor({3, 4}, 24)},
                         {0});
}

TEST(Gradcheck, SoftmaxCrossEntropySparseAndDense) {
  Tensor logits = random_tensor({5, 4}, 25, -2, 2);
  Tensor labels = Tensor::from_vector({5}, std::vector<std::int32_t>{0, 3, 1, 1, 2});
  expect_gradients_match([](const Inputs& in) { return softmax_cross_entropy_with_logits(in[1], in[0]); },
                         {logits, labels}, {0});
  Tensor dist = softmax(random_tensor({5, 4}, 26));
  expect_gradients_match([](const Inputs& in) { return softmax_cross_entropy_with_logits(in[1], in[0]); },
                         {logits, dist}, {0});
}

TEST(Gradcheck, DropoutWithFixedMask) {
  const Generator g(27);
  expect_gradients_match([g](const Inputs& in) { return dropout(in[0], 0.3f, g); }, {random_tensor({40}, 28)}, {0});
}

TEST(Gradcheck, ComposedMlpLoss) {
  // A two-layer network and its loss: checks that gradients flow through a chain.
  Tensor x = random_tensor({6, 5}, 29);
  Tensor w1 = random_tensor({5, 4}, 30), b1 = random_tensor({4}, 31, 0.2f, 0.4f);
  Tensor w2 = random_tensor({4, 3}, 32), b2 = random_tensor({3}, 33);
  Tensor labels = Tensor::from_vector({6}, std::vector<std::int32_t>{0, 1, 2, 0, 1, 2});
  expect_gradients_match(
      [labels](const Inputs& in) {
        Tensor h = dense(in[0], in[1], in[2], Activation::tanh);
        Tensor logits = dense(h, in[3], in[4], Activation::linear);
        return reduce_mean(softmax_cross_entropy_with_logits(labels, logits));
      },
      {x, w1, b1, w2, b2}, {0, 1, 2, 3, 4});
}

}  // namespace
}  // namespace dtrain
