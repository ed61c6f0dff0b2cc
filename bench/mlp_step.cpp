// One training step of an MLP (default: the seeds' large model, 1024 -> Dense 1024 relu
// -> Dense 1024 relu -> Dense 10, batch 64, Adam, cross-entropy from logits), split into
// forward, backward and optimizer, against a roofline built from what this machine
// measures in the same run: oneDNN's own matmul time at each of the step's shapes, plus
// the optimizer's bytes at memcpy bandwidth.
//
//   bench_mlp_step [--model seed_large|fashion_mnist] [--quick]
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <cstring>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

struct MlpSpec {
  const char* name;
  std::int64_t batch;
  std::vector<std::int64_t> widths;  // input, hidden..., classes
};

const MlpSpec kModels[] = {
    {"seed_large", 64, {1024, 1024, 1024, 10}},
    {"fashion_mnist", 128, {784, 256, 128, 10}},
};

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

struct MatmulShape {
  std::int64_t M, K, N;
  bool ta, tb;
};

// Every matmul of one step: a forward and a weight gradient per layer, and an input
// gradient for every layer but the first (the data needs none).
std::vector<MatmulShape> step_matmuls(const MlpSpec& m) {
  std::vector<MatmulShape> out;
  for (size_t l = 0; l + 1 < m.widths.size(); ++l) {
    const std::int64_t in = m.widths[l], o = m.widths[l + 1];
    out.push_back({m.batch, in, o, false, false});  // y = x · W
    out.push_back({in, m.batch, o, true, false});   // dW = xᵀ · dz
    if (l > 0) out.push_back({m.batch, o, in, false, true});  // dx = dz · Wᵀ
  }
  return out;
}

struct PhaseTimes {
  double forward, backward, optimizer, step;
};

PhaseTimes time_steps(const MlpSpec& spec, int warmup, int steps) {
  set_random_seed(1);
  std::vector<std::unique_ptr<nn::Dense>> layers;
  for (size_t l = 1; l < spec.widths.size(); ++l)
    layers.push_back(std::make_unique<nn::Dense>(spec.widths[l], l + 1 < spec.widths.size() ? "relu" : ""));
  losses::SparseCategoricalCrossentropy loss_fn(/*from_logits=*/true);
  optim::Adam optimizer;
  data::Split d = data::make_synthetic(spec.batch, spec.widths.front(), spec.widths.back(), 3);
  std::vector<Variable*> vars;
  std::vector<double> fwd, bwd, opt, total;
  for (int step = 0; step < warmup + steps; ++step) {
    const double t0 = bench::now();
    GradientTape tape;
    Tensor h = d.x;
    for (auto& l : layers) h = (*l)(h, true);
    Tensor loss = loss_fn(d.y, h);
    const double t1 = bench::now();
    if (vars.empty())
      for (auto& l : layers)
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
  const MlpSpec* spec = &kModels[0];
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--model"))
      for (const auto& m : kModels)
        if (!std::strcmp(argv[i + 1], m.name)) spec = &m;
  const int steps = quick ? 20 : 200;
  double params = 0, flops = 0;
  for (size_t l = 0; l + 1 < spec->widths.size(); ++l) params += static_cast<double>((spec->widths[l] + 1) * spec->widths[l + 1]);
  for (const auto& s : step_matmuls(*spec)) flops += 2.0 * s.M * s.K * s.N;
  // Adam reads w, g, m, v and writes w, m, v: 7 floats per parameter.
  const double optimizer_bytes = params * 7 * 4;
  std::printf("%s MLP, batch %lld, Adam: %.3f M parameters, %.1f MFLOP per step; median of %d steps\n\n", spec->name,
              static_cast<long long>(spec->batch), params * 1e-6, flops * 1e-6, steps);
  std::printf("| threads | forward ms | backward ms | optimizer ms | step ms | samples/s | GFLOP/s | "
              "roofline ms (matmul + optimizer) | share of roofline | step ms, mixed_bfloat16 | f32 / mixed |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    double matmul_s = 0;
    for (const auto& s : step_matmuls(*spec)) matmul_s += onednn_matmul_seconds(s.M, s.K, s.N, s.ta, s.tb);
    const double bandwidth = bench::memcpy_bandwidth();
    const double roofline = matmul_s + optimizer_bytes / bandwidth;
    const PhaseTimes t = time_steps(*spec, 20, steps);
    // The same step with the layers under the mixed_bfloat16 policy (bfloat16 matmuls).
    const PhaseTimes mixed = [&] {
      nn::ScopedGlobalPolicy policy("mixed_bfloat16");
      return time_steps(*spec, 20, steps);
    }();
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %.0f | %.1f | %.3f (%.3f + %.3f at %.1f GB/s) | %.0f%% | %.3f | %.2f |\n",
                threads, t.forward * 1e3, t.backward * 1e3, t.optimizer * 1e3, t.step * 1e3, spec->batch / t.step,
                flops / t.step * 1e-9, roofline * 1e3, matmul_s * 1e3, optimizer_bytes / bandwidth * 1e3,
                bandwidth * 1e-9, 100.0 * roofline / t.step, mixed.step * 1e3, t.step / mixed.step);
    std::fflush(stdout);
  }
  return 0;
}
