#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/gradcheck.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/backend.h"

namespace dtrain::kernels {
namespace {

using testing::random_tensor;

TEST(SoftmaxCrossEntropy, SparseAndDenseMatchNaive) {
  Tensor logits = Tensor::from_vector({2, 3}, {1, 2, 3, 0, 0, 50});
  Tensor labels = Tensor::from_vector({2}, std::vector<std::int32_t>{0, 2});
  Tensor loss = Tensor::empty({2}), lp = Tensor::empty({2, 3});
  backend().softmax_cross_entropy(logits, labels, loss, lp);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(loss.to_vector()[0], -std::log(std::exp(1.0) / z), 1e-5);
  EXPECT_NEAR(loss.to_vector()[1], std::log1p(2 * std::exp(-50.0)), 1e-6);  // stable for large logits

  Tensor dist = Tensor::from_vector({2, 3}, {1, 0, 0, 0, 0.5f, 0.5f});
  Tensor loss2 = Tensor::empty({2});
  backend().softmax_cross_entropy(logits, dist, loss2, lp);
  EXPECT_NEAR(loss2.to_vector()[0], loss.to_vector()[0], 1e-6);
  EXPECT_NEAR(loss2.to_vector()[1], 0.5 * (50 + std::log1p(2 * std::exp(-50.0))) + 0.5 * std::log1p(2 * std::exp(-50.0)),
              1e-4);
}

TEST(SoftmaxCrossEntropy, BackwardIsSoftmaxMinusTarget) {
  Tensor logits = random_tensor({4, 5}, 3);
  Tensor labels = Tensor::from_vector({4}, std::vector<std::int32_t>{0, 4, 2, 2});
  Tensor loss = Tensor::empty({4}), lp = Tensor::empty({4, 5}), probs = Tensor::empty({4, 5});
  backend().softmax_cross_entropy(logits, labels, loss, lp);
  backend().softmax(logits, probs, false);
  Tensor dloss = Tensor::from_vector({4}, {1, 2, 0.5f, -1});
  Tensor dx = Tensor::empty({4, 5});
  backend().softmax_cross_entropy_backward(lp, labels, dloss, dx);
  const auto p = probs.to_vector(), d = dx.to_vector(), dl = dloss.to_vector();
  const int lab[] = {0, 4, 2, 2};
  for (int b = 0; b < 4; ++b)
    for (int c = 0; c < 5; ++c) EXPECT_NEAR(d[b * 5 + c], dl[b] * (p[b * 5 + c] - (c == lab[b])), 1e-6);
}

TEST(SoftmaxCrossEntropy, BadLabelNamesRowAndValue) {
  Tensor logits = Tensor::zeros({3, 4});
  Tensor labels = Tensor::from_vector({3}, std::vector<std::int32_t>{0, 7, 1});
  Tensor loss = Tensor::empty({3}), lp = Tensor::empty({3, 4});
  try {
    backend().softmax_cross_entropy(logits, labels, loss, lp);
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("label 7"), std::string::npos) << m;
    EXPECT_NE(m.find("row 1"), std::string::npos) << m;
  }
}

TEST(Dropout, KeepsRateAndScalesAndIgnoresThreadCount) {
  Tensor x = Tensor::full({100000}, 1.0f);
  Tensor y1 = Tensor::empty(x.shape()), m1 = Tensor::empty(x.shape());
  Tensor y2 = Tensor::empty(x.shape()), m2 = Tensor::empty(x.shape());
  const int saved = num_threads();
  set_num_threads(1);
  backend().dropout(x, 0.25f, Generator(5), y1, m1);
  set_num_threads(2);
  backend().dropout(x, 0.25f, Generator(5), y2, m2);
  set_num_threads(saved);
  EXPECT_EQ(y1.to_vector(), y2.to_vector());
  const auto v = y1.to_vector();
  double kept = 0, sum = 0;
  for (float f : v) {
    ASSERT_TRUE(f == 0.0f || std::fabs(f - 1.0f / 0.75f) < 1e-6f);
    kept += f != 0.0f;
    sum += f;
  }
  EXPECT_NEAR(kept / v.size(), 0.75, 0.01);
  EXPECT_NEAR(sum / v.size(), 1.0, 0.02);  // inverted dropout keeps the mean
  EXPECT_THROW(backend().dropout(x, 1.0f, Generator(5), y1, m1), InvalidArgument);
}

TEST(Argmax, FirstOnTies) {
  Tensor x = Tensor::from_vector({3, 3}, {1, 3, 3, 5, 4, 0, 0, 0, 0});
  Tensor out = Tensor::empty({3}, DType::i32);
  backend().argmax(x, out);
  EXPECT_EQ(out.to_vector(), (std::vector<float>{1, 0, 0}));
}

TEST(OneHot, RowsAndRangeCheck) {
  Tensor labels = Tensor::from_vector({2}, std::vector<std::int32_t>{2, 0});
  Tensor out = Tensor::empty({2, 3});
  backend().one_hot(labels, out);
  EXPECT_EQ(out.to_vector(), (std::vector<float>{0, 0, 1, 1, 0, 0}));
  Tensor bad = Tensor::from_vector({1}, std::vector<std::int32_t>{3});
  Tensor out2 = Tensor::empty({1, 3});
  EXPECT_THROW(backend().one_hot(bad, out2), InvalidArgument);
}

// Scalar references written from the published update rules.
TEST(Updates, AdamMatchesScalarReferenceOverSteps) {
  const int n = 50000;  // large enough to run multithreaded
  Tensor w = random_tensor({n}, 1), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  const std::vector<float> w0 = w.to_vector();
  std::vector<double> rw(w0.begin(), w0.end()), rm(n, 0), rv(n, 0);
  AdamUpdate p;
  p.learning_rate = 0.01f;
  p.weight_decay = 0.1f;
  for (int step = 1; step <= 3; ++step) {
    Tensor g = random_tensor({n}, 100 + step);
    const auto gv = g.to_vector();
    p.step = step;
    backend().adam_update(w, g, m, v, p);
    const double a = 0.01 * std::sqrt(1 - std::pow(0.999, step)) / (1 - std::pow(0.9, step));
    for (int i = 0; i < n; ++i) {
      rm[i] = 0.9 * rm[i] + 0.1 * gv[i];
      rv[i] = 0.999 * rv[i] + 0.001 * gv[i] * gv[i];
      rw[i] -= 0.01 * 0.1 * rw[i];
      rw[i] -= a * rm[i] / (std::sqrt(rv[i]) + 1e-7);
    }
  }
  const auto got = w.to_vector();
  for (int i = 0; i < n; ++i) ASSERT_NEAR(got[i], rw[i], 1e-5) << i;
}

// Moments below float32's normal range (1.2e-38) become zero while dtrain flushes
// denormals, and stay as they are when it is told not to; the caller's own floating-point
// mode is the same afterwards either way. Both sizes: on the calling thread and split
// over the pool.
TEST(Updates, AdamFlushesDenormalMomentsUnlessToldNot) {
  constexpr float kDenormal = 1e-39f;
  ASSERT_LT(kDenormal, std::numeric_limits<float>::min());
  struct Restore {
    ~Restore() { set_flush_denormals(true); }
  } restore;
  for (const std::int64_t n : {std::int64_t{100}, std::int64_t{50000}}) {
    for (const bool flush : {true, false}) {
      set_flush_denormals(flush);
      Tensor w = Tensor::full({n}, 0.5f), g = Tensor::zeros({n});
      Tensor m = Tensor::full({n}, kDenormal), v = Tensor::full({n}, kDenormal);
#if defined(__x86_64__) || defined(__i386__)
      constexpr unsigned kControl = ~0x3Fu;  // the mode bits, not the sticky exception flags
      const unsigned before = _mm_getcsr() & kControl;
#endif
      backend().adam_update(w, g, m, v, AdamUpdate{});
#if defined(__x86_64__) || defined(__i386__)
      EXPECT_EQ(_mm_getcsr() & kControl, before) << "n " << n;
#endif
      for (const Tensor* t : {&m, &v}) {
        const std::vector<float> got = t->to_vector();
        for (std::int64_t i = 0; i < n; i += n / 10) {
          if (flush)
            ASSERT_EQ(got[static_cast<std::size_t>(i)], 0.0f) << "n " << n << ", element " << i;
          else
            ASSERT_GT(got[static_cast<std::size_t>(i)], 0.0f) << "n " << n << ", element " << i;
        }
      }
    }
  }
}

TEST(Updates, SgdMomentumAndNesterov) {
  for (bool nesterov : {false, true}) {
    Tensor w = Tensor::from_vector({2}, {1, -1}), vel = Tensor::zeros({2});
    double rw[2] = {1, -1}, rv[2] = {0, 0};
    SgdUpdate p{.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = nesterov};
    for (int step = 0; step < 3; ++step) {
      Tensor g = Tensor::from_vector({2}, {0.5f, 2.0f});
      backend().sgd_update(w, g, &vel, p);
      const double gv[2] = {0.5, 2.0};
      for (int i = 0; i < 2; ++i) {
        rv[i] = 0.9 * rv[i] - 0.1 * gv[i];
        rw[i] += nesterov ? 0.9 * rv[i] - 0.1 * gv[i] : rv[i];
      }
    }
    EXPECT_NEAR(w.to_vector()[0], rw[0], 1e-6);
    EXPECT_NEAR(w.to_vector()[1], rw[1], 1e-6);
  }
}

// The updates say whether every weight they wrote is finite: one NaN or infinite gradient
// anywhere (the last element, or one in the middle of another thread's chunk) is reported,
// by each update rule, on one thread and over the pool.
TEST(Updates, ReportAWeightThatIsNoLongerFinite) {
  for (const std::int64_t n : {std::int64_t{37}, std::int64_t{50001}}) {
    for (const float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      for (const std::int64_t at : {n - 1, n / 2 + 3}) {
        for (int rule = 0; rule < 4; ++rule) {
          Tensor w = random_tensor({n}, 3), g = random_tensor({n}, 4), m = Tensor::zeros({n}),
                 v = Tensor::zeros({n}), vel = Tensor::zeros({n});
          auto update = [&] {
            if (rule == 0) return backend().adam_update(w, g, m, v, AdamUpdate{});
            SgdUpdate p{.learning_rate = 0.1f, .momentum = rule == 1 ? 0.0f : 0.9f, .nesterov = rule == 3};
            return backend().sgd_update(w, g, rule == 1 ? nullptr : &vel, p);
          };
          EXPECT_TRUE(update()) << "rule " << rule << ", n " << n;
          g.data<float>()[at] = poison;
          EXPECT_FALSE(update()) << "rule " << rule << ", n " << n << ", element " << at << " = " << poison;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dtrain::kernels
