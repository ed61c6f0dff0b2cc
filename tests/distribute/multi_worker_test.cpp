// MultiWorkerMirroredStrategy across processes on 127.0.0.1: workers reach one process's
// weights, a killed worker is named by the others within the timeout, a stray process
// with the wrong token is refused, different models are caught before training, workers
// whose data differ in length end their epochs together, and record files are shared out
// among the workers by file.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/compare.h"
#include "common/small_cnn.h"
#include "common/tiny_transformer.h"
#include "common/spawn.h"
#include "common/temp_dir.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

// The task program: DTRAIN_MULTI_WORKER_TASK from the environment where set (the GPU
// check runs these tests from its bundle), else the one this build made.
std::string task_program() {
  const char* given = std::getenv("DTRAIN_MULTI_WORKER_TASK");
  return given != nullptr && *given != '\0' ? given : DTRAIN_MULTI_WORKER_TASK;
}

using Clock = std::chrono::steady_clock;
using testing::relative_difference;

// The sanitizer builds run the same tests on a smaller MLP.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kFeatures = 128, kHidden = 128;
#else
constexpr int kFeatures = 1024, kHidden = 1024;  // the seeds' large MLP
#endif

struct TaskResult {
  std::string task;
  pid_t pid = 0;
  int status = -1;        // from waitpid; -1: still running at the limit (then killed)
  double exited_at = 0;   // seconds since the cluster started
  std::string log;        // its stdout and stderr
  bool exited_ok() const { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

class MultiWorker : public testing::TempDirTest {
 protected:
  // Runs the task program once per worker with TF_CONFIG for a cluster of `workers` on
  // 127.0.0.1, waiting at most `limit` seconds (then kills what is left). A task named
  // `hangs` is killed once all the others have ended.
  std::vector<TaskResult> run_cluster(int workers, std::vector<std::string> args,
                                      const std::map<std::string, std::string>& token_of = {},
                                      const std::string& hangs = "", double limit = 240) {
    const cluster::ClusterSpec spec = cluster::local_cluster(workers, 0, false, cluster::free_ports(workers));
    args.insert(args.begin(), {task_program(), "--out", dir_.string()});
    std::vector<TaskResult> results;
    std::vector<pid_t> pids;
    std::vector<int> pidfds;
    const auto start = Clock::now();
    for (const cluster::TaskId& id : spec.training_tasks()) {
      TaskResult r;
      r.task = id.to_string();
      const std::string log = (dir_ / (r.task + ".log")).string();
      const std::string tf_config = cluster::tf_config_json(spec, id);
      const auto token = token_of.find(r.task);
      const std::string token_value = token == token_of.end() ? "test-token" : token->second;
      const pid_t pid = testing::spawn(
          args, {{"TF_CONFIG", tf_config}, {"DTRAIN_CLUSTER_TOKEN", token_value}, {"OMP_NUM_THREADS", "1"}}, log);
      pids.push_back(pid);
      pidfds.push_back(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
      r.pid = pid;
      results.push_back(r);
    }
    std::size_t running = pids.size();
    while (running > (hangs.empty() ? 0u : 1u)) {
      std::vector<pollfd> fds;
      for (int fd : pidfds) fds.push_back(pollfd{fd, fd >= 0 ? short(POLLIN) : short(0), 0});
      const double left = limit - std::chrono::duration<double>(Clock::now() - start).count();
      if (left <= 0) break;
      ::poll(fds.data(), fds.size(), static_cast<int>(left * 1000) + 1);
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pidfds[i] < 0 || !(fds[i].revents & POLLIN)) continue;
        waitpid(pids[i], &results[i].status, 0);
        results[i].exited_at = std::chrono::duration<double>(Clock::now() - start).count();
        ::close(pidfds[i]);
        pidfds[i] = -1;
        --running;
      }
    }
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (pidfds[i] < 0) continue;
      kill(pids[i], SIGKILL);
      waitpid(pids[i], nullptr, 0);
      ::close(pidfds[i]);
      if (results[i].task != hangs) ADD_FAILURE() << results[i].task << " was still running after " << limit << " s";
    }
    for (TaskResult& r : results) {
      std::ifstream in(dir_ / (r.task + ".log"));
      std::ostringstream text;
      text << in.rdbuf();
      r.log = text.str();
    }
    return results;
  }

  // The task's model with --seed: layers drawing from set_random_seed's sequence.
  static std::unique_ptr<Sequential> unseeded_mlp(std::uint64_t seed) {
    set_random_seed(seed);
    auto model = std::make_unique<Sequential>();
    model->add<nn::Dense>(kHidden, "relu");
    model->add<nn::Dense>(kHidden, "relu");
    model->add<nn::Dense>(10, "softmax");
    model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    model->build(Shape{kFeatures});
    return model;
  }

  static std::unique_ptr<Sequential> mlp(std::uint64_t seed = 0) {
    auto model = std::make_unique<Sequential>();
    model->add<nn::Dense>(kHidden, "relu", nn::DenseOptions{.seed = seed + 1});
    model->add<nn::Dense>(kHidden, "relu", nn::DenseOptions{.seed = seed + 2});
    model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = seed + 3});
    model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    model->build(Shape{kFeatures});
    return model;
  }

  std::unique_ptr<Sequential> saved(const std::string& task) {
    auto model = mlp();
    model->load_weights((dir_ / (task + ".safetensors")).string());
    return model;
  }

  static FitOptions quiet(std::int64_t batch) {
    FitOptions o;
    o.batch_size = batch;
    o.shuffle = false;
    o.verbose = 0;
    return o;
  }

  // One process trained on these global batches (rows of d, step by step) against what the
  // workers saved: the chief within 1e-4, every other worker exactly the chief's weights.
  void expect_one_process_agrees(const std::vector<TaskResult>& results, const data::Split& d,
                                 const std::vector<std::vector<std::int64_t>>& steps, std::int64_t batch) {
    std::vector<data::Element> batches;
    for (const auto& rows : steps) batches.push_back(data::gather_rows({d.x, d.y}, rows));
    auto reference = mlp();
    reference->fit(data::Dataset::from_generator([&](std::int64_t i) -> std::optional<data::Element> {
                     if (i >= static_cast<std::int64_t>(batches.size())) return std::nullopt;
                     return batches[static_cast<std::size_t>(i)];
                   }),
                   quiet(batch));
    EXPECT_LE(relative_difference(*saved(results[0].task), *reference), 1e-4);
    for (std::size_t w = 1; w < results.size(); ++w)
      EXPECT_EQ(relative_difference(*saved(results[w].task), *saved(results[0].task)), 0.0) << results[w].task;
  }

  static std::vector<std::string> size_args() {
    return {"--features", std::to_string(kFeatures), "--hidden", std::to_string(kHidden)};
  }
};

std::string describe(const std::vector<TaskResult>& results) {
  std::string out;
  for (const TaskResult& r : results) out += "--- " + r.task + "\n" + r.log;
  return out;
}

TEST_F(MultiWorker, TwoAndThreeWorkersReachOneProcessWeightsWithAndWithoutOverlap) {
  // 20 steps of a global batch of 64, on one process.
  data::Split d = data::make_synthetic(20 * 64, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  auto reference = mlp();
  reference->fit(d.x, d.y, quiet(64));
  for (int workers : {2, 3}) {
    for (const char* overlap : {"1", "0"}) {
      for (const char* communication : {"auto", "ring"}) {
        std::vector<std::string> args = size_args();
        args.insert(args.end(), {"--overlap", overlap, "--communication", communication});
        const std::vector<TaskResult> results = run_cluster(workers, args);
        for (const TaskResult& r : results) {
          ASSERT_TRUE(r.exited_ok()) << describe(results);
          EXPECT_NE(r.log.find("steps=20"), std::string::npos) << r.log;
          // Workers of one host sum through shared memory unless asked to keep to TCP.
          EXPECT_NE(r.log.find(std::string(" transport=") +
                               (communication == std::string("ring") ? "TCP (asked for)" : "shared memory")),
                    std::string::npos)
              << r.log;
        }
        const auto chief = saved(results[0].task);
        const double diff = relative_difference(*chief, *reference);
        EXPECT_LE(diff, 1e-4) << workers << " workers, overlap " << overlap << ", " << communication;
        RecordProperty("relative_difference_" + std::to_string(workers) + "_overlap" + overlap + "_" + communication,
                       std::to_string(diff));
        for (std::size_t w = 1; w < results.size(); ++w)
          EXPECT_EQ(relative_difference(*saved(results[w].task), *chief), 0.0)
              << results[w].task << " ended with other weights than " << results[0].task;
      }
    }
  }
}

// Synchronized batch norms sum their statistics over every worker's replicas inside the
// step, forward and backward: 2 and 3 workers (1 and 2 replicas each) end at one process's
// weights and moving statistics.
TEST_F(MultiWorker, SynchronizedBatchNormReachesOneProcessWeights) {
  const auto [x, y] = testing::random_images(8 * 24, 7);
  auto reference = testing::small_cnn(true);
  FitOptions o = quiet(24);
  reference->fit(x, y, o);
  for (int workers : {2, 3}) {
    for (const char* replicas : {"1", "2"}) {
      const std::vector<TaskResult> results =
          run_cluster(workers, {"--model", "cnn", "--steps", "8", "--batch", "24", "--replicas", replicas});
      for (const TaskResult& r : results) ASSERT_TRUE(r.exited_ok()) << describe(results);
      std::vector<std::unique_ptr<Model>> ended;
      for (const TaskResult& r : results) {
        ended.push_back(testing::small_cnn(true));
        ended.back()->load_weights((dir_ / (r.task + ".safetensors")).string());
      }
      const double diff = relative_difference(*ended[0], *reference);
      EXPECT_LE(diff, 1e-4) << workers << " workers of " << replicas << " replicas";
      RecordProperty("relative_difference_" + std::to_string(workers) + "x" + replicas, std::to_string(diff));
      for (std::size_t w = 1; w < ended.size(); ++w)
        EXPECT_EQ(relative_difference(*ended[w], *ended[0]), 0.0) << results[w].task;
    }
  }
}

// A transformer (embedding, learned positions, causal attention, layer norms, GELU): two
// workers end at one process's weights (per value: the keys' bias, which gets no gradient,
// stays at rounding's scale), every worker exactly the chief's.
TEST_F(MultiWorker, ATransformerReachesOneProcessWeights) {
  const testing::TokenData d = testing::ordered_pairs(6 * 16);
  auto reference = testing::tiny_transformer(12, 16, /*causal=*/true);
  reference->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  reference->fit(d.ids, d.labels, quiet(16));
  const std::vector<TaskResult> results = run_cluster(2, {"--model", "transformer", "--steps", "6", "--batch", "16"});
  for (const TaskResult& r : results) ASSERT_TRUE(r.exited_ok()) << describe(results);
  std::vector<std::unique_ptr<Model>> ended;
  for (const TaskResult& r : results) {
    ended.push_back(testing::tiny_transformer(12, 16, true));
    ended.back()->load_weights((dir_ / (r.task + ".safetensors")).string());
  }
  double worst = 0;
  for (std::size_t i = 0; i < reference->variables().size(); ++i) {
    const std::vector<float> a = ended[0]->variables()[i]->value().to_vector(), b = reference->variables()[i]->value().to_vector();
    for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::abs(a[j] - b[j])));
  }
  EXPECT_LE(worst, 1e-4);
  EXPECT_EQ(relative_difference(*ended[1], *ended[0]), 0.0);
}

TEST_F(MultiWorker, WorkersMeetThroughARedisServer) {
  const char* server = "/usr/bin/redis-server";
  if (::access(server, X_OK) != 0) GTEST_SKIP() << "no " << server << " (scripts/install-deps.sh installs redis-server)";
  // A Redis server of the test's own on 127.0.0.1, stopped at the end.
  const std::string port = std::to_string(cluster::free_ports(1)[0]);
  const std::string log = (dir_ / "redis.log").string();
  const pid_t redis = fork();
  if (redis == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(server, server, "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  struct StopRedis {
    pid_t pid;
    ~StopRedis() {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  } stop{redis};
  // The workers retry nothing: wait (at most 10 s) until the server accepts connections.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (bool up = false; !up;) {
    ASSERT_LT(Clock::now(), deadline) << "redis-server did not start";
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port)));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  data::Split d = data::make_synthetic(20 * 64, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  auto reference = mlp();
  reference->fit(d.x, d.y, quiet(64));
  setenv("DTRAIN_REDIS", ("127.0.0.1:" + port).c_str(), 1);
  const std::vector<TaskResult> results = run_cluster(2, size_args());
  unsetenv("DTRAIN_REDIS");
  for (const TaskResult& r : results) ASSERT_TRUE(r.exited_ok()) << describe(results);
  EXPECT_LE(relative_difference(*saved(results[0].task), *reference), 1e-4);
  EXPECT_EQ(relative_difference(*saved(results[1].task), *saved(results[0].task)), 0.0);
  // They met there: the server holds the job's keys, under its token.
  const std::string keys = (dir_ / "keys.txt").string();
  const std::string command = "redis-cli -h 127.0.0.1 -p " + port + " --scan --pattern 'dtrain-job/test-token*' > " + keys;
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream in(keys);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) count += line.find("dtrain/arrived/") != std::string::npos;
  EXPECT_EQ(count, 2) << "the workers' arrival keys are not in Redis";
}

TEST_F(MultiWorker, TwoLocalReplicasPerWorkerReachOneProcessWeights) {
  // 10 steps: summing (g0 + g1) + (g2 + g3) instead of one device's order flips the sign
  // of a few gradients that are nearly zero, and Adam turns each flip into a whole step of
  // the learning rate; here that happens between steps 10 and 20 (1.3e-4 after 20).
  data::Split d = data::make_synthetic(10 * 64, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  auto reference = mlp();
  reference->fit(d.x, d.y, quiet(64));
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--replicas", "2", "--steps", "10"});
  for (int workers : {1, 2}) {
    const std::vector<TaskResult> results = run_cluster(workers, args);
    for (const TaskResult& r : results) ASSERT_TRUE(r.exited_ok()) << describe(results);
    EXPECT_LE(relative_difference(*saved(results[0].task), *reference), 1e-4) << workers << " workers";
    for (std::size_t w = 1; w < results.size(); ++w)
      EXPECT_EQ(relative_difference(*saved(results[w].task), *saved(results[0].task)), 0.0);
  }
}

// Workers on GPUs (cuda:0 in each process: processes that share one GPU, or the stand-in
// GPU where there is none): each worker's replicas sum on the GPU, then the workers sum
// through pinned host memory. 1 and 2 workers, 1 and 2 replicas each, reach one process's
// weights, and every worker the chief's exactly.
TEST_F(MultiWorker, GpuWorkersSumThroughPinnedHostMemoryAndReachOneProcessWeights) {
  data::Split d = data::make_synthetic(10 * 64, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  auto reference = mlp();
  reference->fit(d.x, d.y, quiet(64));
  for (const char* replicas : {"1", "2"}) {
    std::vector<std::string> args = size_args();
    args.insert(args.end(), {"--gpu", "1", "--replicas", replicas, "--steps", "10"});
    const std::vector<TaskResult> results = run_cluster(2, args);
    for (const TaskResult& r : results) {
      ASSERT_TRUE(r.exited_ok()) << describe(results);
      // Each process's GPU (the stand-in, or one GPU they share) rules NCCL out, and the
      // transport says why.
      EXPECT_NE(r.log.find("staged through pinned host memory from cuda:0 (NCCL not used: "), std::string::npos)
          << r.log;
    }
    EXPECT_LE(relative_difference(*saved(results[0].task), *reference), 1e-4) << replicas << " replicas";
    EXPECT_EQ(relative_difference(*saved(results[1].task), *saved(results[0].task)), 0.0) << replicas << " replicas";
  }
}

// Workers of two GPUs each (a stand-in of two GPUs in each process): each sums over its
// GPUs, then its first GPU's sum goes to the other worker's through pinned host memory; they
// reach one process's weights, and each has the chief's.
TEST_F(MultiWorker, GpuWorkersOfTwoGpusEachReachOneProcessWeights) {
  data::Split d = data::make_synthetic(10 * 64, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  auto reference = mlp();
  reference->fit(d.x, d.y, quiet(64));
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--gpus", "2", "--steps", "10"});
  const std::vector<TaskResult> results = run_cluster(2, args);
  for (const TaskResult& r : results) {
    ASSERT_TRUE(r.exited_ok()) << describe(results);
    EXPECT_NE(r.log.find(" replicas=2 transport=shared memory, staged through pinned host memory from cuda:0"),
              std::string::npos)
        << r.log;
  }
  EXPECT_LE(relative_difference(*saved(results[0].task), *reference), 1e-4);
  EXPECT_EQ(relative_difference(*saved(results[1].task), *saved(results[0].task)), 0.0);
}

// A GPU worker killed or stopped mid-run is named by the others, as a CPU worker is: its
// process ended, or alive but not answering within the collective timeout.
TEST_F(MultiWorker, AKilledOrStoppedGpuWorkerIsNamedByTheOthers) {
  for (const bool killed : {true, false}) {
    SCOPED_TRACE(killed ? "killed" : "stopped");
    std::vector<std::string> args = size_args();
    args.insert(args.end(), {"--gpu", "1", "--steps", "200", "--timeout", "3", killed ? "--kill-task" : "--stop-task",
                             "worker:1", "--kill-step", "5"});
    const std::vector<TaskResult> results = run_cluster(2, args, {}, killed ? "" : "worker:1");
    ASSERT_EQ(results.size(), 2u);
    if (killed) {
      ASSERT_TRUE(WIFSIGNALED(results[1].status) && WTERMSIG(results[1].status) == SIGKILL) << describe(results);
    }
    EXPECT_TRUE(results[0].status >= 0 && WIFEXITED(results[0].status) && WEXITSTATUS(results[0].status) != 0)
        << describe(results);
    EXPECT_NE(results[0].log.find(killed ? "worker:1 (its process ended)" : "worker:1 (alive, but not answering)"),
              std::string::npos)
        << describe(results);
  }
}

// The epoch's loss the task printed ("loss=...").
double printed_loss(const TaskResult& r) {
  const std::size_t at = r.log.find("loss=");
  return at == std::string::npos ? NAN : std::stod(r.log.substr(at + 5));
}

TEST_F(MultiWorker, CompressedBucketsTrainCloseToFloat32) {
  std::map<std::string, double> loss;
  std::map<std::string, std::unique_ptr<Sequential>> weights;
  for (const char* wire : {"none", "bf16", "fp16"}) {
    std::vector<std::string> args = size_args();
    args.insert(args.end(), {"--compression", wire});
    const std::vector<TaskResult> results = run_cluster(2, args);
    for (const TaskResult& r : results) ASSERT_TRUE(r.exited_ok()) << describe(results);
    loss[wire] = printed_loss(results[0]);
    weights[wire] = saved(results[0].task);
    EXPECT_EQ(relative_difference(*saved(results[1].task), *weights[wire]), 0.0) << wire;
  }
  for (const char* wire : {"bf16", "fp16"}) {
    // 16 bits on the wire change the weights, but not the training: the epoch's loss
    // stays within 0.1% of float32's.
    EXPECT_GT(relative_difference(*weights[wire], *weights["none"]), 0.0) << wire;
    EXPECT_NEAR(loss[wire], loss["none"], 1e-3 * loss["none"]) << wire;
    RecordProperty(std::string("loss_") + wire, std::to_string(loss[wire]));
  }
}

TEST_F(MultiWorker, KilledWorkerIsNamedByTheOthersAsEnded) {
  // Through shared memory, where a peer's process is watched, and over TCP, where its
  // connections close.
  for (const char* communication : {"auto", "ring"}) {
    SCOPED_TRACE(communication);
    std::vector<std::string> args = size_args();
    args.insert(args.end(), {"--steps", "200", "--timeout", "10", "--kill-task", "worker:1", "--kill-step", "5",
                             "--communication", communication});
    const std::vector<TaskResult> results = run_cluster(3, args);
    ASSERT_EQ(results.size(), 3u);
    const TaskResult& killed = results[1];
    ASSERT_TRUE(WIFSIGNALED(killed.status) && WTERMSIG(killed.status) == SIGKILL) << describe(results);
    int saw_it_end = 0;
    for (const TaskResult& r : {results[0], results[2]}) {
      EXPECT_TRUE(r.status >= 0 && WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << describe(results);
      EXPECT_NE(r.log.find("worker:1 (its process ended)"), std::string::npos)
          << r.task << " does not name the dead task:\n" << describe(results);
      // How soon is not asserted: a figure on the test's clock depends on the scheduler.
      // Each of their waits is bounded by the 10 s timeout, and run_cluster's limit ends
      // the test in any case.
      saw_it_end +=
          r.log.find("worker:1's process (pid " + std::to_string(killed.pid) + ") ended") != std::string::npos;
    }
    // In shared memory at least one of them saw the process end (the other may hear of it
    // as the first one giving up).
    if (communication == std::string("auto")) {
      EXPECT_GE(saw_it_end, 1) << describe(results);
    }
  }
}

TEST_F(MultiWorker, HungWorkerIsNamedByTheOthersAsAliveButNotAnswering) {
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--steps", "200", "--timeout", "10", "--stop-task", "worker:1", "--kill-step", "5"});
  const std::vector<TaskResult> results = run_cluster(3, args, {}, "worker:1");
  ASSERT_EQ(results.size(), 3u);
  // The workers waiting on worker:1 time out; one that was waiting on them instead hears
  // of it when they shut their connections. Both name the hung worker.
  int timed_out = 0;
  for (const TaskResult& r : {results[0], results[2]}) {
    EXPECT_TRUE(r.status >= 0 && WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << describe(results);
    EXPECT_NE(r.log.find("worker:1 (alive, but not answering)"), std::string::npos) << describe(results);
    timed_out += r.log.find("(no answer within the 10 s timeout, then the roll call)") != std::string::npos;
  }
  // Those that timed out say it was the first timeout, followed by the roll call: one
  // timeout, not two, without a figure on the test's clock.
  EXPECT_GE(timed_out, 1) << describe(results);
}

TEST_F(MultiWorker, InitialWeightsAreOneProcessWeightsFromTheSameSeed) {
  // Layers without seeds of their own, one seed for the job: every worker, one or two of
  // them, builds the bits one process builds from that seed.
  const auto reference = unseeded_mlp(42);
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--seed", "42", "--steps", "2"});
  for (int workers : {1, 2}) {
    const std::vector<TaskResult> results = run_cluster(workers, args);
    for (const TaskResult& r : results) {
      ASSERT_TRUE(r.exited_ok()) << describe(results);
      auto initial = mlp();
      initial->load_weights((dir_ / (r.task + ".initial.safetensors")).string());
      EXPECT_EQ(relative_difference(*initial, *reference), 0.0) << r.task << " of " << workers;
    }
  }
}

// The stopped-chief runs: a short collective timeout, worker:0 stopping itself (SIGSTOP)
// at its fifth step; its process serves the rendezvous store, which stops with it.
std::vector<std::string> stopped_chief_args(std::vector<std::string> args) {
  args.insert(args.end(), {"--steps", "200", "--timeout", "4", "--stop-task", "worker:0", "--kill-step", "5"});
  return args;
}

TEST_F(MultiWorker, StoppedChiefIsNamedByTheOthersWithTheTimeItTook) {
  const std::vector<TaskResult> results = run_cluster(3, stopped_chief_args(size_args()), {}, "worker:0");
  ASSERT_EQ(results.size(), 3u);
  int timed_out = 0;
  for (const TaskResult& r : {results[1], results[2]}) {
    EXPECT_TRUE(r.status >= 0 && WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << describe(results);
    // The roll call's request to the frozen store is bounded by the patience (2 s here),
    // not by another timeout.
    EXPECT_NE(r.log.find("not answering: worker:0 (it serves the rendezvous store, which did not answer within 2 s)"),
              std::string::npos)
        << describe(results);
    timed_out += r.log.find("(no answer within the 4 s timeout, then the roll call)") != std::string::npos;
  }
  EXPECT_GE(timed_out, 1) << describe(results);
}

TEST_F(MultiWorker, LauncherNamesTheStoppedChiefNotTheFirstWorkerToGiveUp) {
  cluster::LaunchOptions o;
  o.workers = 3;
  o.command = {task_program(), "--out", dir_.string()};
  for (const std::string& a : stopped_chief_args(size_args())) o.command.push_back(a);
  o.grace_seconds = 2;
  o.timeout_seconds = 240;  // the test's own bound: it never comes near
  std::ostringstream out, err;
  o.out = &out;
  o.err = &err;
  const cluster::LaunchResult result = cluster::launch(o);
  EXPECT_EQ(result.exit_code, 1) << err.str();
  EXPECT_FALSE(result.deadline_passed) << err.str();
  EXPECT_EQ(result.failed_task, "worker:0") << err.str() << out.str();
  std::string last;
  std::istringstream lines(err.str());
  for (std::string line; std::getline(lines, line);) last = line;
  EXPECT_EQ(last.rfind("dtrain launch: failed: worker:0 was stopped by signal " + std::to_string(SIGSTOP) +
                           " (SIGSTOP) and stopped answering (worker:",
                       0),
            0u)
      << err.str();
}

// The link probe: over TCP every worker all-reduces 1 MiB again after resting 20 to 100 ms
// together (a collective out of step would hang them); through shared memory there is no
// rate limiter to look for.
TEST_F(MultiWorker, TheLinkProbeLooksForABurstAfterARestOverTcpOnly) {
  for (const char* communication : {"ring", "auto"}) {
    const std::vector<TaskResult> results = run_cluster(2, {"--model", "link", "--communication", communication});
    for (const TaskResult& r : results) {
      ASSERT_TRUE(r.exited_ok()) << describe(results);
      const std::size_t at = r.log.find(" rest=");
      ASSERT_NE(at, std::string::npos) << r.log;
      const double rest = std::stod(r.log.substr(at + 6));
      if (communication == std::string("ring")) {
        EXPECT_GE(rest, 0.02) << r.log;
        EXPECT_LE(rest, 0.1) << r.log;
        EXPECT_NE(r.log.find(" rested_bytes=1048576 "), std::string::npos) << r.log;
      } else {
        EXPECT_EQ(rest, 0.0) << r.log;
        EXPECT_NE(r.log.find(" burst=0 "), std::string::npos) << r.log;
      }
    }
  }
}

// The GPU path probe times fit's own gradient sum between GPU workers (here processes of
// one GPU or the stand-in: staged through pinned host memory), which includes a copy each
// way and so moves fewer bytes a second than the copies alone; workers on CPUs are refused.
TEST_F(MultiWorker, TheGpuPathProbeTimesTheStagedSumAndTheCopies) {
  const std::vector<TaskResult> results = run_cluster(2, {"--model", "gpu_path", "--gpu", "1"});
  for (const TaskResult& r : results) {
    ASSERT_TRUE(r.exited_ok()) << describe(results);
    auto figure = [&](const std::string& key) {
      const std::size_t at = r.log.find(" " + key + "=");
      return at == std::string::npos ? -1.0 : std::stod(r.log.substr(at + key.size() + 2));
    };
    EXPECT_GT(figure("bandwidth"), 0.0) << r.log;
    EXPECT_GE(figure("latency"), 0.0) << r.log;
    EXPECT_LT(figure("bandwidth"), figure("copy")) << r.log;
    EXPECT_EQ(figure("samples"), 3.0) << r.log;
    EXPECT_NE(r.log.find(" path=shared memory, staged through pinned host memory from cuda:0 (NCCL not used: "),
              std::string::npos)
        << r.log;
  }
  const std::vector<TaskResult> on_cpus = run_cluster(2, {"--model", "gpu_path", "--timeout", "5"});
  for (const TaskResult& r : on_cpus) {
    EXPECT_FALSE(r.exited_ok());
    EXPECT_NE(r.log.find("measure_gpu_path: the path between GPU workers needs replicas on GPUs"), std::string::npos)
        << r.log;
  }
}

TEST_F(MultiWorker, WrongTokenIsRefused) {
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--timeout", "5"});
  const std::vector<TaskResult> results = run_cluster(2, args, {{"worker:1", "stray-token"}});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[1].exited_ok());
  EXPECT_NE(results[1].log.find("DTRAIN_CLUSTER_TOKEN"), std::string::npos) << results[1].log;
  // The chief waited for worker:1, which never joined, and says so.
  EXPECT_FALSE(results[0].exited_ok());
  EXPECT_NE(results[0].log.find("never arrived: worker:1"), std::string::npos) << results[0].log;
}

TEST_F(MultiWorker, DifferentModelsAreAnErrorOnEveryWorker) {
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--timeout", "20", "--mismatch-task", "worker:1"});
  const std::vector<TaskResult> results = run_cluster(2, args);
  for (const TaskResult& r : results) {
    EXPECT_FALSE(r.exited_ok()) << r.log;
    EXPECT_NE(r.log.find("worker:1 built a different model from worker:0"), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("dense_1/kernel"), std::string::npos) << r.log;
  }
}

TEST_F(MultiWorker, UnevenShardsEndEveryEpochTogether) {
  // Worker 0 has 5 batches of 16, worker 1 has 3: every epoch is 5 steps everywhere, the
  // last two with worker 1's part empty. One process on the same global batches agrees.
  constexpr int kBatch = 16;
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--batch", std::to_string(kBatch), "--uneven", "1"});
  const std::vector<TaskResult> results = run_cluster(2, args);
  for (const TaskResult& r : results) {
    ASSERT_TRUE(r.exited_ok()) << describe(results);
    EXPECT_NE(r.log.find("steps=5"), std::string::npos) << r.log;
  }
  data::Split d = data::make_synthetic(5 * 2 * kBatch, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  std::vector<std::vector<std::int64_t>> steps;
  for (std::int64_t step = 0; step < 5; ++step) {
    std::vector<std::int64_t> rows;
    for (std::int64_t w = 0; w < 2; ++w)
      if (step < 5 - 2 * w)
        for (std::int64_t i = 0; i < kBatch; ++i) rows.push_back(w * 5 * kBatch + step * kBatch + i);
    steps.push_back(rows);
  }
  expect_one_process_agrees(results, d, steps, kBatch);
}

TEST_F(MultiWorker, RecordFilesAreShardedByFile) {
  // Four record files of 24, 8, 16 and 8 rows: worker 0 reads files 0 and 2 (5 batches of
  // 8 rows), worker 1 files 1 and 3 (2 batches); the global batch is 16. Every epoch is 5
  // steps everywhere, and one process on the same global batches agrees.
  constexpr int kBatch = 16, kPart = kBatch / 2;
  const std::vector<std::int64_t> file_rows = {24, 8, 16, 8};
  data::Split d = data::make_synthetic(56, kFeatures, 10, 7, data::SyntheticLabels::teacher);
  std::vector<std::vector<std::int64_t>> worker_rows(2);
  std::int64_t row = 0;
  for (std::size_t k = 0; k < file_rows.size(); ++k) {
    data::RecordWriter w((dir_ / ("part-" + std::to_string(k) + ".rec")).string());
    for (std::int64_t i = 0; i < file_rows[k]; ++i, ++row) {
      w.write(data::encode_element({d.x.row(row, Shape{kFeatures}), d.y.row(row, Shape{})}));
      worker_rows[k % 2].push_back(row);
    }
    w.close();
  }
  std::vector<std::string> args = size_args();
  args.insert(args.end(), {"--batch", std::to_string(kBatch), "--files", "4", "--steps", "5"});
  const std::vector<TaskResult> results = run_cluster(2, args);
  for (const TaskResult& r : results) ASSERT_TRUE(r.exited_ok()) << describe(results);
  EXPECT_NE(results[0].log.find("auto-shard FILE: this worker reads input files 0, 2 (2 of 4)"), std::string::npos)
      << results[0].log;
  EXPECT_NE(results[1].log.find("auto-shard FILE: this worker reads input files 1, 3 (2 of 4)"), std::string::npos)
      << results[1].log;

  std::vector<std::vector<std::int64_t>> steps;
  for (std::size_t step = 0; step < 5; ++step) {
    std::vector<std::int64_t> rows;
    for (const auto& mine : worker_rows)
      for (std::size_t i = step * kPart; i < std::min(mine.size(), (step + 1) * kPart); ++i) rows.push_back(mine[i]);
    steps.push_back(rows);
  }
  expect_one_process_agrees(results, d, steps, kBatch);
}

}  // namespace
}  // namespace dtrain
