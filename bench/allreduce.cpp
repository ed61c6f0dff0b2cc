// In-process all-reduce throughput: R replica threads sum a bucket of S bytes with the
// same InProcessAllReduce that fit() uses, against the memory-bandwidth bound measured in
// the same run. Reducing R arrays of S bytes in memory reads R·S bytes and writes S (the
// sum is shared, so the all-gather moves nothing), so at memcpy's read+write rate B the
// bound is (R+1)·S / B.
//
//   bench_allreduce [--replicas 2] [--quick]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "dtrain/comm/in_process.h"
#include "dtrain/core/threads.h"
#include "timing.h"

using namespace dtrain;

namespace {

// A barrier that spins: the replicas have a core each, and the clock should measure the
// all-reduce, not a futex wake-up.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    const int generation = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == generation) __builtin_ia32_pause();
  }

 private:
  const int n_;
  std::atomic<int> count_{0}, generation_{0};
};

// Median seconds of one all-reduce of `floats` floats over `replicas` threads: the clock
// runs from a common start to the moment the last replica has the sum. As in benchmarks
// of collectives, the inputs are not rewritten between rounds; the sum is checked.
double allreduce_seconds(int replicas, std::size_t floats, std::size_t chunk_floats, int rounds) {
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(replicas), std::vector<float>(std::max<std::size_t>(floats, 1)));
  for (std::size_t r = 0; r < buffers.size(); ++r) std::fill(buffers[r].begin(), buffers[r].end(), static_cast<float>(r + 1));
  std::vector<float> output(std::max<std::size_t>(floats, 1));
  comm::InProcessAllReduce all_reduce(replicas, {{floats}}, {output.data()}, chunk_floats);
  SpinBarrier sync(replicas);
  std::vector<double> samples;
  bool right = true;
  auto body = [&](int r) {
    for (int round = 0; round < rounds + 2; ++round) {
      sync.arrive_and_wait();
      const double t0 = bench::now();
      all_reduce.set_input(r, 0, 0, buffers[static_cast<std::size_t>(r)].data());
      all_reduce.arrive(r, 0);
      all_reduce.finish(r);
      sync.arrive_and_wait();  // every replica has the sum
      if (r == 0 && round == 0 && floats)
        right = output[floats - 1] == static_cast<float>(replicas * (replicas + 1) / 2);
      if (r == 0 && round >= 2) samples.push_back(bench::now() - t0);  // two warm-up rounds
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < replicas; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  if (!right) std::fprintf(stderr, "wrong sum for %zu floats\n", floats);
  return bench::median(samples);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  const int replicas = bench::int_flag(argc, argv, "--replicas", 2);
  set_num_threads(replicas);
  const double bound_bw = bench::memcpy_bandwidth();
  std::printf("In-process all-reduce, %d replica threads; memcpy read+write bandwidth here: %.1f GB/s\n", replicas,
              bound_bw / 1e9);
  std::printf("bound = (replicas + 1) * size / memcpy bandwidth\n\n");
  std::printf("| size | us | GB/s of data (size / time) | GB/s of memory traffic | bound us | of bound |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (std::size_t bytes = 4096; bytes <= (std::size_t{64} << 20); bytes *= quick ? 16 : 4) {
    const std::size_t floats = bytes / sizeof(float);
    const int rounds = bytes >= (std::size_t{16} << 20) ? 15 : 101;
    const double t = allreduce_seconds(replicas, floats, 16384, quick ? 5 : rounds);
    const double traffic = static_cast<double>(replicas + 1) * static_cast<double>(bytes);
    const double bound = traffic / bound_bw;
    const std::string size = bytes >= (1u << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
    std::printf("| %s | %.1f | %.2f | %.2f | %.1f | %.0f%% |\n", size.c_str(), t * 1e6, static_cast<double>(bytes) / t / 1e9,
                traffic / t / 1e9, bound * 1e6, 100.0 * bound / t);
  }
  if (!quick) {
    std::printf("\nChunk size (the unit one replica claims):\n\n| chunk | 4 MiB, us | 64 MiB, us |\n|---|---|---|\n");
    for (std::size_t chunk : {std::size_t{1024}, std::size_t{4096}, std::size_t{16384}, std::size_t{65536}, std::size_t{262144}})
      std::printf("| %zu KiB | %.1f | %.1f |\n", chunk * 4 / 1024, allreduce_seconds(replicas, (4u << 20) / 4, chunk, 101) * 1e6,
                  allreduce_seconds(replicas, (64u << 20) / 4, chunk, 15) * 1e6);
  }
  return 0;
}
