// A planted load for the doctor's busy-machine tests: `busy_load spin CPU` keeps one core
// busy with arithmetic; `busy_load memory CPU MiB` streams a buffer of MiB through memory,
// reading and writing, on that core. Either ends when its parent does, or after ten
// minutes, whichever comes first; it prints "ready" once it runs.
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3 || (std::string(argv[1]) != "spin" && std::string(argv[1]) != "memory")) {
    std::fprintf(stderr, "usage: busy_load spin CPU | busy_load memory CPU MiB\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(std::atoi(argv[2]), &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    std::perror("busy_load: sched_setaffinity");
    return 1;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  const bool memory = std::string(argv[1]) == "memory";
  const std::size_t words = memory ? (std::size_t(argc > 3 ? std::atoi(argv[3]) : 256) << 20) / 8 : 0;
  std::vector<std::uint64_t> a(words, 1), b(words, 2);
  std::printf("ready\n");
  std::fflush(stdout);
  volatile std::uint64_t sink = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (memory) {
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i < words; ++i) sum += a[i];
      std::memcpy(b.data(), a.data(), words * 8);
      sink = sink + sum;
    } else {
      std::uint64_t x = sink;
      for (int i = 0; i < 10000000; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      sink = x;
    }
  }
  return 0;
}
