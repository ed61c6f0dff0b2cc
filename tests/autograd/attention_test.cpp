// Fused scaled dot-product attention: the kernels against attention written out (every
// score, a softmax, the weighted values) with masks, causality and dropout, over blocks of
// queries and keys; gradients against finite differences; queries that see no key; and
// memory that grows with the sequence, not with its square.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/gradcheck.h"
#include "dtrain/core/allocator.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_tensor;

// Attention written out in double: q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv].
std::vector<double> reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& c) {
  const std::int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), D = q.dim(3), S = k.dim(1), Dv = v.dim(3);
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const Tensor mask = c.mask.defined() ? c.mask.astype(DType::f32) : Tensor();
  std::vector<double> out(static_cast<std::size_t>(B * T * H * Dv), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> score(static_cast<std::size_t>(S), -std::numeric_limits<double>::infinity());
        double top = -std::numeric_limits<double>::infinity();
        for (std::int64_t s = 0; s < S; ++s) {
          const bool seen = (!c.causal || s <= t) && (!mask.defined() || mask.data<float>()[(b * T + t) * S + s] != 0.0f);
          if (!seen) continue;
          double x = 0;
          for (std::int64_t d = 0; d < D; ++d)
            x += double(pq[((b * T + t) * H + h) * D + d]) * pk[((b * S + s) * H + h) * D + d];
          score[static_cast<std::size_t>(s)] = x * c.scale;
          top = std::max(top, x * c.scale);
        }
        if (top == -std::numeric_limits<double>::infinity()) continue;
        double sum = 0;
        for (double& x : score) sum += (x = std::exp(x - top));
        for (std::int64_t s = 0; s < S; ++s) {
          double w = score[static_cast<std::size_t>(s)] / sum;
          if (c.dropout_rate > 0) {
            const auto i = static_cast<std::uint64_t>(((b * H + h) * T + t) * S + s);
            w = c.dropout_generator.uniform_at(i) >= c.dropout_rate ? w / (1.0 - c.dropout_rate) : 0.0;
          }
          for (std::int64_t j = 0; j < Dv; ++j)
            out[static_cast<std::size_t>(((b * T + t) * H + h) * Dv + j)] += w * pv[((b * S + s) * H + h) * Dv + j];
        }
      }
  return out;
}

Tensor random_mask(std::int64_t b, std::int64_t t, std::int64_t s, std::uint64_t seed) {
  Generator g(seed);
  Tensor m = Tensor::empty(Shape{b, t, s}, DType::i32);
  for (std::int64_t i = 0; i < m.numel(); ++i) m.data<std::int32_t>()[i] = g.uniform() < 0.7f ? 1 : 0;
  return m;
}

void expect_matches_reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& c,
                              const char* what) {
  const std::vector<float> got = scaled_dot_product_attention(q, k, v, c).to_vector();
  const std::vector<double> want = reference(q, k, v, c);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LT(worst, 2e-5) << what;
}

// The CPU's two kinds of register tiles, each against the written-out attention: four
// rows by 64 columns, and by 16 (where the CPU has AVX2 and FMA; chosen by itself where it
// lacks AVX-512).
class AttentionTiles : public ::testing::TestWithParam<kernels::AttentionTiles> {
 protected:
  void SetUp() override {
    if (!kernels::set_attention_tiles(GetParam())) GTEST_SKIP() << "this CPU has no AVX2 with FMA for the narrow tiles";
  }
  void TearDown() override { kernels::set_attention_tiles(kernels::AttentionTiles::automatic); }
};

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionTiles, ::testing::Values(kernels::AttentionTiles::wide, kernels::AttentionTiles::narrow),
                         [](const ::testing::TestParamInfo<kernels::AttentionTiles>& tiles) {
                           return tiles.param == kernels::AttentionTiles::wide ? "wide" : "narrow";
                         });

TEST_P(AttentionTiles, MatchesAttentionWrittenOutAcrossBlocks) {
  // 70 queries and 130 keys cross the kernels' blocks of 32 queries and 64 keys.
  const Tensor q = random_tensor({2, 70, 3, 5}, 1), k = random_tensor({2, 130, 3, 5}, 2),
               v = random_tensor({2, 130, 3, 4}, 3);
  expect_matches_reference(q, k, v, {.scale = 0.5f}, "plain");
  expect_matches_reference(q, k, v, {.scale = 0.5f, .mask = random_mask(2, 70, 130, 4)}, "masked");
  expect_matches_reference(q, k, v, {.scale = 0.7f, .causal = true}, "causal");
  AttentionCall dropped{.scale = 0.5f, .causal = true, .mask = random_mask(2, 70, 130, 5), .dropout_rate = 0.3f,
                        .dropout_generator = Generator(9, 17)};
  expect_matches_reference(q, k, v, dropped, "masked, causal, dropout");
  // Large scores stay finite: the online softmax subtracts each query's running maximum.
  expect_matches_reference(q, k, v, {.scale = 40.0f}, "large scores");
  // Heads 64 deep and values 96 wide take the kernel's tiles of four queries by 64 columns
  // (and the columns past them one query at a time); 70 queries end in a short tile.
  const Tensor q64 = random_tensor({2, 70, 2, 64}, 6), k64 = random_tensor({2, 130, 2, 64}, 7),
               v96 = random_tensor({2, 130, 2, 96}, 8);
  expect_matches_reference(q64, k64, v96, {.scale = 0.125f}, "deep: plain");
  expect_matches_reference(q64, k64, v96, {.scale = 0.125f, .causal = true, .mask = random_mask(2, 70, 130, 9)},
                           "deep: masked, causal");
  expect_matches_reference(q64, k64, v96, {.scale = 0.125f, .dropout_rate = 0.3f, .dropout_generator = Generator(4, 2)},
                           "deep: dropout");
}

TEST_P(AttentionTiles, GradientsMatchFiniteDifferences) {
  const Tensor q = random_tensor({1, 40, 2, 3}, 11), k = random_tensor({1, 70, 2, 3}, 12),
               v = random_tensor({1, 70, 2, 2}, 13);
  for (const AttentionCall& c :
       {AttentionCall{.scale = 0.8f}, AttentionCall{.scale = 0.8f, .causal = true, .mask = random_mask(1, 40, 70, 14)},
        AttentionCall{.scale = 0.8f, .mask = random_mask(1, 40, 70, 15), .dropout_rate = 0.25f,
                      .dropout_generator = Generator(3)}}) {
    SCOPED_TRACE(std::string(c.causal ? "causal " : "") + (c.mask.defined() ? "masked " : "") +
                 (c.dropout_rate > 0 ? "dropout" : ""));
    expect_gradients_match([&](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], c); },
                           {q, k, v}, {0, 1, 2}, {.eps = 1e-2, .atol = 2e-3, .rtol = 2e-2});
  }
}

TEST_P(AttentionTiles, DeepHeadsGradientsMatchTheWrittenOutAttention) {
  // Heads 64 deep and values 96 wide run backward's four-row and four-key tiles (and the
  // columns past 64 apart); 37 queries and 70 keys end in short tiles and blocks. The
  // gradient of Σ out · r at sampled elements against central differences of the attention
  // written out in double.
  const Tensor q = random_tensor({1, 37, 2, 64}, 21), k = random_tensor({1, 70, 2, 64}, 22),
               v = random_tensor({1, 70, 2, 96}, 23), r = random_tensor({1, 37, 2, 96}, 24, 0.5f, 1.5f);
  const std::vector<float> rv = r.to_vector();
  for (const AttentionCall& c :
       {AttentionCall{.scale = 0.125f}, AttentionCall{.scale = 0.125f, .causal = true, .mask = random_mask(1, 37, 70, 25)},
        AttentionCall{.scale = 0.125f, .dropout_rate = 0.25f, .dropout_generator = Generator(5)}}) {
    SCOPED_TRACE(std::string(c.causal ? "causal, masked" : c.dropout_rate > 0 ? "dropout" : "plain"));
    std::vector<Tensor> inputs{q.clone(), k.clone(), v.clone()};
    std::vector<Tensor> analytic;
    {
      GradientTape tape;
      for (const Tensor& x : inputs) tape.watch(x);
      analytic = tape.gradient(scaled_dot_product_attention(inputs[0], inputs[1], inputs[2], c), inputs, r);
    }
    auto loss = [&] {
      const std::vector<double> out = reference(inputs[0], inputs[1], inputs[2], c);
      double sum = 0;
      for (std::size_t i = 0; i < out.size(); ++i) sum += out[i] * rv[i];
      return sum;
    };
    Generator pick(26);
    for (std::size_t which = 0; which < 3; ++which) {
      float* x = inputs[which].data<float>();
      const std::vector<float> a = analytic[which].to_vector();
      for (int sample = 0; sample < 24; ++sample) {
        const auto j = static_cast<std::int64_t>(pick.below(static_cast<std::uint64_t>(inputs[which].numel())));
        const float saved = x[j];
        x[j] = saved + 1e-2f;
        const double up = loss();
        x[j] = saved - 1e-2f;
        const double down = loss();
        x[j] = saved;
        const double numeric = (up - down) / (double(saved + 1e-2f) - double(saved - 1e-2f));
        ASSERT_NEAR(a[static_cast<std::size_t>(j)], numeric, 1e-4 + 1e-3 * std::abs(numeric))
            << "input " << which << " element " << j;
      }
    }
  }
}

TEST(Attention, AQueryThatSeesNoKeyGetsZerosAndNoGradient) {
  const Tensor q = random_tensor({1, 3, 1, 4}, 21), k = random_tensor({1, 5, 1, 4}, 22), v = random_tensor({1, 5, 1, 2}, 23);
  Tensor mask = Tensor::empty(Shape{3, 5}, DType::i32);
  for (std::int64_t i = 0; i < 15; ++i) mask.data<std::int32_t>()[i] = i / 5 == 1 ? 0 : 1;  // query 1 sees nothing
  Tensor qv = q, kv = k, vv = v;
  GradientTape tape;
  for (Tensor* t : {&qv, &kv, &vv}) tape.watch(*t);
  const Tensor out = scaled_dot_product_attention(qv, kv, vv, {.scale = 1.0f, .mask = mask});
  const std::vector<float> o = out.to_vector();
  EXPECT_EQ(o[2], 0.0f);
  EXPECT_EQ(o[3], 0.0f);
  EXPECT_NE(o[0], 0.0f);
  const std::vector<Tensor> g = tape.gradient(out, {qv, kv, vv});
  const std::vector<float> dq = g[0].to_vector();
  for (int j = 4; j < 8; ++j) EXPECT_EQ(dq[static_cast<std::size_t>(j)], 0.0f) << j;
  for (float x : g[1].to_vector()) EXPECT_TRUE(std::isfinite(x));
}

TEST(Attention, MemoryGrowsWithTheSequenceNotItsSquare) {
  // 4096 queries and keys: their scores alone would be 64 MiB; the operands are 0.5 MiB each.
  const std::int64_t n = 4096;
  const Tensor q = random_tensor({1, n, 1, 32}, 31), k = random_tensor({1, n, 1, 32}, 32),
               v = random_tensor({1, n, 1, 32}, 33);
  cpu_allocator().reset_peak();
  const std::size_t before = cpu_allocator().stats().bytes_in_use;
  const Tensor out = scaled_dot_product_attention(q, k, v, {.scale = 0.2f, .causal = true});
  const std::size_t grew = cpu_allocator().stats().peak_bytes_in_use - before;
  EXPECT_LE(grew, 2u * 1024 * 1024) << "attention over " << n << " positions allocated " << grew << " bytes";
  EXPECT_TRUE(std::isfinite(out.to_vector().back()));
}

TEST(Attention, MismatchedOperandsAreNamed) {
  const Tensor q = random_tensor({1, 3, 2, 4}, 1), k = random_tensor({1, 5, 2, 4}, 2), v = random_tensor({1, 6, 2, 4}, 3);
  try {
    scaled_dot_product_attention(q, k, v);
    FAIL() << "v of another length was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("do not match"), std::string::npos) << e.what();
  }
  EXPECT_THROW(scaled_dot_product_attention(q, k, k, {.mask = Tensor::zeros(Shape{1, 4, 5})}), InvalidArgument);
}

}  // namespace
}  // namespace dtrain
