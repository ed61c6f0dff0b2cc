// All-reduce between processes through dtrain's GlooGroup, beside Gloo called directly
// (a prebuilt AllreduceRing, and gloo::allreduce's ring), on the same TCP connections'
// kind. Run it under the launcher, which gives each process its TF_CONFIG:
//
//   dtrain launch --workers 2 -- bench/bench_gloo_allreduce [--quick]
//
// Task 0 serves the rendezvous store on its TF_CONFIG address and prints the table.
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "dtrain/cluster/tf_config.h"
#include "dtrain/comm/gloo_group.h"
#include "dtrain/comm/tcp_store.h"
#include "timing.h"

using namespace dtrain;

namespace {

// Median seconds of fn() over `rounds` calls after two warm-ups, with a barrier before
// each so that every rank starts together.
template <typename Fn>
double median_seconds(comm::GlooGroup& group, int rounds, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < rounds + 2; ++i) {
    group.barrier();
    const double t0 = bench::now();
    fn();
    if (i >= 2) t.push_back(bench::now() - t0);
  }
  return bench::median(t);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  const cluster::TfConfig config = cluster::tf_config_from_environment();
  const std::vector<cluster::TaskId> tasks = config.cluster.training_tasks();
  int rank = 0;
  while (rank < static_cast<int>(tasks.size()) && !(tasks[static_cast<std::size_t>(rank)] == config.task)) ++rank;
  const int size = static_cast<int>(tasks.size());
  const cluster::Address store_at = config.cluster.address(tasks[0]);
  std::unique_ptr<comm::TcpStoreServer> server;
  if (rank == 0) server = std::make_unique<comm::TcpStoreServer>(store_at.host, store_at.port, "bench");
  auto store = std::make_shared<comm::TcpStore>(store_at.host, store_at.port, "bench", std::chrono::seconds(30));
  comm::GlooGroupOptions o;
  o.rank = rank;
  o.size = size;
  for (const auto& t : tasks) o.task_names.push_back(t.to_string());
  comm::GlooGroup group(store, o);

  // Gloo called directly, on a context of its own.
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  gloo::rendezvous::PrefixStore prefixed("raw", *store);
  context->connectFullMesh(prefixed, device);

  if (rank == 0) {
    std::printf("All-reduce (sum, float32) between %d processes on 127.0.0.1, median per call\n\n", size);
    std::printf("| size | dtrain GlooGroup, us | GB/s | Gloo AllreduceRing (prebuilt), us | GB/s | gloo::allreduce ring, us | GB/s |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
  }
  std::uint32_t tag = 1000;
  for (std::size_t bytes = 4096; bytes <= (std::size_t{64} << 20); bytes *= quick ? 16 : 4) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> a(n, 1.0f), b(n, 1.0f), c(n, 1.0f);
    const int rounds = bytes >= (std::size_t{16} << 20) ? 5 : (quick ? 5 : 21);
    const double t_dtrain = median_seconds(group, rounds, [&] { group.allreduce(a.data(), n, bytes); });
    gloo::AllreduceRing<float> ring(context, {b.data()}, static_cast<int>(n));
    const double t_ring = median_seconds(group, rounds, [&] { ring.run(); });
    const double t_new = median_seconds(group, rounds, [&] {
      gloo::AllreduceOptions opts(context);
      opts.setInput(c.data(), n);
      opts.setOutput(c.data(), n);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(tag++);
      gloo::allreduce(opts);
    });
    if (rank == 0) {
      const std::string label = bytes >= (1u << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf("| %s | %.0f | %.3f | %.0f | %.3f | %.0f | %.3f |\n", label.c_str(), t_dtrain * 1e6, gb / t_dtrain,
                  t_ring * 1e6, gb / t_ring, t_new * 1e6, gb / t_new);
      std::fflush(stdout);
    }
  }
  group.barrier();
  return 0;
}
