// Matmul GFLOP/s through dtrain's kernel interface against oneDNN called directly (the
// same library, no dtrain in between), at M = 64, 256, 1024 with N = K = 1024, on 1 and 2
// threads; plus bf16 inputs (AMX on CPUs that have it) through the kernel interface.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

Tensor random_matrix(std::int64_t r, std::int64_t c, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty({r, c});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = g.uniform(-1, 1);
  return t;
}

// oneDNN 2.6 matmul, created once, executed in the loop.
double direct_onednn_seconds(const Tensor& a, const Tensor& b, Tensor& c) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const memory::dim M = a.dim(0), K = a.dim(1), N = b.dim(1);
  memory::desc a_md({M, K}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc b_md({K, N}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc c_md({M, N}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  dnnl::matmul prim(pd);
  memory am(a_md, eng, a.raw_data()), bm(b_md, eng, b.raw_data()), cm(c_md, eng, c.raw_data());
  return bench::seconds_per_call([&] {
    prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  });
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  std::printf("matmul C[M,1024] = A[M,1024] · B[1024,1024], GFLOP/s (median of 7 samples of >= 0.2 s)\n\n");
  std::printf("| threads | M | dtrain kernels f32 | oneDNN direct f32 | ratio | dtrain kernels bf16 |\n");
  std::printf("|---|---|---|---|---|---|\n");
  auto& be = kernels::backend();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (std::int64_t M : {64, 256, 1024}) {
      if (quick && M > 64) continue;
      const std::int64_t N = 1024, K = 1024;
      Tensor a = random_matrix(M, K, 1), b = random_matrix(K, N, 2), c = Tensor::empty({M, N});
      Tensor a16 = a.astype(DType::bf16), b16 = b.astype(DType::bf16);
      const double flops = 2.0 * M * N * K;
      const double t_ours = bench::seconds_per_call([&] { be.matmul(a, b, c, {}); });
      const double t_direct = direct_onednn_seconds(a, b, c);
      const double t_bf16 = bench::seconds_per_call([&] { be.matmul(a16, b16, c, {}); });
      std::printf("| %d | %lld | %.1f | %.1f | %.2f | %.1f |\n", threads, static_cast<long long>(M),
                  flops / t_ours * 1e-9, flops / t_direct * 1e-9, t_direct / t_ours, flops / t_bf16 * 1e-9);
      std::fflush(stdout);
    }
  }
  return 0;
}
