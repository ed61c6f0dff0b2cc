// One training step of the seeds' large MLP (1024 -> Dense 1024 relu -> Dense 1024 relu
// -> Dense 10, batch 64, Adam, cross-entropy from logits), split into forward, backward
// and optimizer, against a roofline built from what this machine measures in the same
// run: oneDNN's own matmul time at each of the step's shapes, plus the optimizer's bytes
// at memcpy bandwidth.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

constexpr std::int64_t kBatch = 64, kIn = 1024, kHidden = 1024, kClasses = 10;

// Seconds per matmul C[M,N] = op(A)[M,K] · op(B)[K,N] with oneDNN called directly.
double onednn_matmul_seconds(std::int64_t M, std::int64_t K, std::int64_t N, bool ta, bool tb) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
  memory::desc a_md({M, K}, memory::data_type::f32, ta ? memory::dims{1, M} : memory::dims{K, 1});
  memory::desc b_md({K, N}, memory::data_type::f32, tb ? memory::dims{1, K} : memory::dims{N, 1});
  memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{N, 1});
  dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  return bench::seconds_per_call([&] {
    prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  }, 5, 0.1);
}

struct Shape3 {
  std::int64_t M, K, N;
  bool ta, tb;
};

// Every matmul of one step: 3 forward, 3 weight gradients, 2 input gradients (the first
// layer's input needs none).
const Shape3 kStepMatmuls[] = {
    {kBatch, kIn, kHidden, false, false},      {kBatch, kHidden, kHidden, false, false},
    {kBatch, kHidden, kClasses, false, false}, {kIn, kBatch, kHidden, true, false},
    {kHidden, kBatch, kHidden, true, false},   {kHidden, kBatch, kClasses, true, false},
    {kBatch, kHidden, kHidden, false, true},   {kBatch, kClasses, kHidden, false, true},
};

double step_flops() {
  double f = 0;
  for (const auto& s : kStepMatmuls) f += 2.0 * s.M * s.K * s.N;
  return f;
}

struct PhaseTimes {
  double forward, backward, optimizer, step;
};

PhaseTimes time_steps(int warmup, int steps) {
  set_random_seed(1);
  nn::Dense d1(kHidden, "relu"), d2(kHidden, "relu"), d3(kClasses);
  losses::SparseCategoricalCrossentropy loss_fn(/*from_logits=*/true);
  optim::Adam optimizer;
  Generator g(3);
  Tensor x = Tensor::empty({kBatch, kIn});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = g.normal();
  Tensor y = Tensor::empty({kBatch}, DType::i32);
  for (std::int64_t i = 0; i < kBatch; ++i) y.data<std::int32_t>()[i] = static_cast<std::int32_t>(g.below(kClasses));
  std::vector<Variable*> vars;
  std::vector<double> fwd, bwd, opt, total;
  for (int step = 0; step < warmup + steps; ++step) {
    const double t0 = bench::now();
    GradientTape tape;
    Tensor loss = loss_fn(y, d3(d2(d1(x, true), true), true));
    const double t1 = bench::now();
    if (vars.empty())
      for (nn::Layer* l : {static_cast<nn::Layer*>(&d1), static_cast<nn::Layer*>(&d2), static_cast<nn::Layer*>(&d3)})
        for (Variable* v : l->trainable_variables()) vars.push_back(v);
    std::vector<Tensor> grads = tape.gradient(loss, vars);
    const double t2 = bench::now();
    optimizer.apply_gradients(grads, vars);
    const double t3 = bench::now();
    if (step >= warmup) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      opt.push_back(t3 - t2);
      total.push_back(t3 - t0);
    }
  }
  return {bench::median(fwd), bench::median(bwd), bench::median(opt), bench::median(total)};
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  const int steps = quick ? 20 : 200;
  const double params = 2.0 * (kHidden * kIn + kHidden) + kClasses * kHidden + kClasses;
  // Adam reads w, g, m, v and writes w, m, v: 7 floats per parameter.
  const double optimizer_bytes = params * 7 * 4;
  std::printf("seed large MLP, batch %lld, Adam: %.2f M parameters, %.1f MFLOP per step; median of %d steps\n\n",
              static_cast<long long>(kBatch), params * 1e-6, step_flops() * 1e-6, steps);
  std::printf("| threads | forward ms | backward ms | optimizer ms | step ms | samples/s | GFLOP/s | "
              "roofline ms (matmul + optimizer) | share of roofline |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    double matmul_s = 0;
    for (const auto& s : kStepMatmuls) matmul_s += onednn_matmul_seconds(s.M, s.K, s.N, s.ta, s.tb);
    const double bandwidth = bench::memcpy_bandwidth();
    const double roofline = matmul_s + optimizer_bytes / bandwidth;
    const PhaseTimes t = time_steps(20, steps);
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.0f | %.1f | %.2f (%.2f + %.2f at %.1f GB/s) | %.0f%% |\n", threads,
                t.forward * 1e3, t.backward * 1e3, t.optimizer * 1e3, t.step * 1e3, kBatch / t.step,
                step_flops() / t.step * 1e-9, roofline * 1e3, matmul_s * 1e3, optimizer_bytes / bandwidth * 1e3,
                bandwidth * 1e-9, 100.0 * roofline / t.step);
    std::fflush(stdout);
  }
  return 0;
}
