// GradientTape semantics, as TensorFlow users know them.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "dtrain/autograd/ops.h"
#include "dtrain/autograd/variable.h"

namespace dtrain {
namespace {

TEST(GradientTape, VariablesAreWatchedWhenRead) {
  Variable w("w", Tensor::from_vector({2}, {3, 4}));
  GradientTape tape;
  Tensor loss = reduce_sum(square(w.value()));
  Variable* vars[] = {&w};
  auto grads = tape.gradient(loss, vars);
  ASSERT_TRUE(grads[0].defined());
  EXPECT_EQ(grads[0].to_vector(), (std::vector<float>{6, 8}));
}

TEST(GradientTape, NonTrainableAndUnrelatedGiveUndefined) {
  Variable frozen("frozen", Tensor::from_vector({1}, {2}), /*trainable=*/false);
  Variable unused("unused", Tensor::from_vector({1}, {2}));
  Tensor x = Tensor::from_vector({1}, {5});
  GradientTape tape;
  Tensor y = mul(frozen.value(), x);
  Variable* vars[] = {&frozen, &unused};
  auto grads = tape.gradient(y, vars);
  EXPECT_FALSE(grads[0].defined());
  EXPECT_FALSE(grads[1].defined());
}

TEST(GradientTape, NothingRecordedWithoutWatchedInputs) {
  GradientTape tape;
  Tensor x = Tensor::from_vector({3}, {1, 2, 3});
  Tensor y = relu(x);
  EXPECT_EQ(tape.num_recorded(), 0u);
  tape.watch(x);
  y = relu(x);
  EXPECT_EQ(tape.num_recorded(), 1u);
}

TEST(GradientTape, NonPersistentAnswersOnce) {
  Tensor x = Tensor::from_vector({1}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor y = square(x);
  EXPECT_EQ(tape.gradient(y, {x})[0].item(), 6.0f);
  EXPECT_THROW(tape.gradient(y, {x}), InvalidArgument);
}

TEST(GradientTape, PersistentAnswersRepeatedly) {
  Tensor x = Tensor::from_vector({1}, {3});
  GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  Tensor y = square(x);
  Tensor z = mul(y, y);  // x^4
  EXPECT_EQ(tape.gradient(y, {x})[0].item(), 6.0f);
  EXPECT_EQ(tape.gradient(z, {x})[0].item(), 108.0f);
}

TEST(GradientTape, ReusedTensorAccumulates) {
  Tensor x = Tensor::from_vector({2}, {1.5f, -2});
  GradientTape tape;
  tape.watch(x);
  Tensor y = add(mul(x, x), x);  // x^2 + x
  auto g = tape.gradient(y, {x});
  EXPECT_EQ(g[0].to_vector(), (std::vector<float>{4, -3}));
}

TEST(GradientTape, StopRecordingPausesTheTape) {
  Tensor x = Tensor::from_vector({1}, {2});
  GradientTape tape;
  tape.watch(x);
  Tensor y = square(x);
  {
    auto pause = tape.stop_recording();
    y = mul(y, Tensor::from_vector({1}, {10}));  // not recorded
  }
  auto g = tape.gradient(y, {x});
  EXPECT_FALSE(g[0].defined());
}

TEST(GradientTape, NestedTapesBothRecord) {
  Tensor x = Tensor::from_vector({1}, {3});
  GradientTape outer;
  outer.watch(x);
  Tensor y;
  {
    GradientTape inner;
    inner.watch(x);
    y = square(x);
    EXPECT_EQ(inner.gradient(y, {x})[0].item(), 6.0f);
  }
  Tensor z = mul(y, x);  // x^3, recorded only on the outer tape
  EXPECT_EQ(outer.gradient(z, {x})[0].item(), 27.0f);
}

TEST(GradientTape, GradientOfIntermediateTensor) {
  Tensor x = Tensor::from_vector({1}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor h = square(x);
  Tensor y = affine(h, 2.0f);
  auto g = tape.gradient(y, {h, x});
  EXPECT_EQ(g[0].item(), 2.0f);
  EXPECT_EQ(g[1].item(), 12.0f);
}

TEST(GradientTape, OutputGradientShapeIsChecked) {
  Tensor x = Tensor::from_vector({2}, {1, 2});
  GradientTape tape;
  tape.watch(x);
  Tensor y = square(x);
  EXPECT_THROW(tape.gradient(y, std::vector<Tensor>{x}, Tensor::zeros({3})), InvalidArgument);
}

// Several targets: the gradient of their sum, where one target feeds another and where
// each has its own output gradient; a non-persistent tape still answers once.
TEST(GradientTape, SeveralTargetsGiveTheGradientOfTheirSum) {
  Tensor x = Tensor::from_vector({2}, {3, -1});
  GradientTape tape;
  tape.watch(x);
  Tensor h = square(x);        // 2x
  Tensor y = affine(h, 2.0f);  // 4x, through h
  Tensor z = reduce_sum(x);    // 1
  const Tensor targets[] = {h, y, z};
  const Tensor seeds[] = {Tensor::from_vector({2}, {1, 0}), Tensor(), Tensor()};
  const Tensor sources[] = {x};
  EXPECT_THROW(tape.gradient(targets, sources, std::span<const Tensor>(seeds, 2)), InvalidArgument);
  const auto g = tape.gradient(targets, sources, seeds);
  // x = 3: 2*3*1 + 4*3 + 1 = 19; x = -1: 2*(-1)*0 + 4*(-1) + 1 = -3.
  EXPECT_EQ(g[0].to_vector(), (std::vector<float>{19, -3}));
  EXPECT_THROW(tape.gradient(targets, sources), InvalidArgument);
}

// stop() is the end of Python's `with` block: what followed is not recorded, gradient()
// still answers, the tape may be destroyed on another thread, and only its own thread may
// stop it.
TEST(GradientTape, StoppedTapeAnswersFromItsRecordOnly) {
  Variable w("w", Tensor::from_vector({2}, {3, 4}));
  auto tape = std::make_unique<GradientTape>();
  Tensor y = reduce_sum(square(w.value()));
  std::thread other([&] { EXPECT_THROW(tape->stop(), InvalidArgument); });
  other.join();
  tape->stop();
  EXPECT_TRUE(tape->stopped());
  const std::size_t recorded = tape->num_recorded();
  Tensor after = mul(y, Tensor::scalar(2.0f));
  EXPECT_EQ(tape->num_recorded(), recorded);
  EXPECT_FALSE(GradientTape::should_record(std::vector<const Tensor*>{&y}));
  Variable* vars[] = {&w};
  EXPECT_EQ(tape->gradient(y, vars)[0].to_vector(), (std::vector<float>{6, 8}));
  std::thread([t = std::move(tape)]() mutable { t.reset(); }).join();
  // This thread's live tapes no longer hold it: a new tape records as usual.
  GradientTape next;
  Tensor z = square(w.value());
  EXPECT_GT(next.num_recorded(), 0u);
  (void)after;
  (void)z;
}

// on_ready reports each variable once its gradient is final, while backward still runs:
// the last layer's first, a variable read twice only after its earlier read, an unused
// one at the end with no gradient; and the reported values are the final gradients.
TEST(GradientTape, ReportsEachGradientAsSoonAsItIsFinal) {
  Variable a("a", Tensor::from_vector({1}, {2.0f})), b("b", Tensor::from_vector({1}, {3.0f}));
  Variable c("c", Tensor::from_vector({1}, {5.0f})), unused("unused", Tensor::from_vector({1}, {1.0f}));
  Tensor x = Tensor::from_vector({1}, {7.0f});
  GradientTape tape;
  // y = ((x * a) * a) * b + c: a is read by two ops, b and c by later ones.
  Tensor h = mul(x, a.value());
  Tensor h2 = mul(h, a.value());
  Tensor y = add(mul(h2, b.value()), c.value());
  std::vector<Variable*> vars{&a, &b, &c, &unused};
  std::vector<std::pair<std::size_t, float>> events;
  auto grads = tape.gradient(y, vars, [&](std::size_t i, const Tensor& g) {
    events.emplace_back(i, g.defined() ? g.item() : -1.0f);
  });
  ASSERT_EQ(events.size(), 4u);
  // c (read by the last op) first, b next, then a once both reads are done, unused last.
  EXPECT_EQ(events[0], (std::pair<std::size_t, float>{2, 1.0f}));
  EXPECT_EQ(events[1], (std::pair<std::size_t, float>{1, 7.0f * 2 * 2}));
  EXPECT_EQ(events[2], (std::pair<std::size_t, float>{0, 2.0f * 7.0f * 2.0f * 3.0f}));
  EXPECT_EQ(events[3], (std::pair<std::size_t, float>{3, -1.0f}));
  EXPECT_EQ(grads[0].item(), events[2].second);
  EXPECT_FALSE(grads[3].defined());
}

TEST(Variable, AssignKeepsIdentityAndChecksShape) {
  Variable v("layer/kernel", Tensor::zeros({2, 2}));
  const auto id = v.id();
  v.assign(Tensor::full({2, 2}, 1.0f));
  EXPECT_EQ(v.id(), id);
  EXPECT_EQ(v.value().to_vector(), (std::vector<float>{1, 1, 1, 1}));
  try {
    v.assign(Tensor::zeros({3}));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layer/kernel"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain
