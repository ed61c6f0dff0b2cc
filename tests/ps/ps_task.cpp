// One task of the parameter-server fault tests, run once per process by
// coordinator_test: reads TF_CONFIG and plays its part. The chief schedules --steps
// closures of a small MLP's training step, joins, and prints its statistics as one line
// ("stats scheduled=.. finished=.. rerun=.. lost=.. applied=.. refused=.."); a worker
// serves, and one may plant a fault: --kill-task worker:K SIGKILLs that worker while it
// runs its --kill-at-th closure, after its gradients reached the parameter servers and
// before the coordinator hears back (the worst moment: the closure must run again and its
// gradients must not count twice); --stop-task stops it (SIGSTOP, a hung process) before it
// pushes; --chief-dies-after N makes the chief SIGKILL itself once N closures are done.
// --then-steps N: after joining, the chief waits until every worker answers again (one
// killed and started again rejoins) and schedules N more closures. --ssp K: ssp(K)
// consistency instead of async. --gpu 1: every task runs under a placement on cuda:0 (the
// machine's GPU, else the stand-in), so the workers train on it and the chief and the ps
// keep their variables on the CPU.
// The chief checks that every closure returned one finite loss. The task runs as one
// gtest test: a failed check or an error ends it with exit code 1.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "common/stand_in_gpu.h"
#include "dtrain/dtrain.h"

namespace {

using namespace dtrain;

struct Args {
  int steps = 40;
  std::string kill_task, stop_task;
  int fault_at = 5;
  double worker_timeout = 2;
  double coordinator_timeout = 20;
  int chief_dies_after = 0;  // > 0: the chief SIGKILLs itself once that many closures are done
  int then_steps = 0;
  int ssp = -1;  // >= 0: ssp(ssp) consistency
  bool gpu = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--kill-task") a.kill_task = v;
    else if (k == "--stop-task") a.stop_task = v;
    else if (k == "--fault-at") a.fault_at = std::stoi(v);
    else if (k == "--worker-timeout") a.worker_timeout = std::stod(v);
    else if (k == "--coordinator-timeout") a.coordinator_timeout = std::stod(v);
    else if (k == "--chief-dies-after") a.chief_dies_after = std::stoi(v);
    else if (k == "--then-steps") a.then_steps = std::stoi(v);
    else if (k == "--ssp") a.ssp = std::stoi(v);
    else if (k == "--gpu") a.gpu = v == "1";
    else throw InvalidArgument("ps_task: unknown option " + k);
  }
  return a;
}

void run(const Args& args) {
  std::optional<dtrain::testing::GpuForTests> gpu;
  std::optional<DevicePlacement> on_gpu;
  if (args.gpu) {
    gpu.emplace();
    on_gpu.emplace(Device::cuda(0));
  }
  distribute::ParameterServerOptions options;
  options.worker_timeout_seconds = args.worker_timeout;
  options.coordinator_timeout_seconds = args.coordinator_timeout;
  options.rpc_timeout_seconds = 20;
  if (args.ssp >= 0) options.consistency = distribute::Consistency::ssp(args.ssp);
  distribute::ParameterServerStrategy strategy(options);
  distribute::ClusterCoordinator coordinator(strategy);
  const std::string me = strategy.task().to_string();
  if (strategy.task().type == "ps") {
    coordinator.serve();
    return;
  }
  std::unique_ptr<Sequential> model;
  std::unique_ptr<optim::Adam> optimizer;
  {
    auto scope = strategy.scope();
    model = std::make_unique<Sequential>();
    model->add<nn::Dense>(32, "relu", nn::DenseOptions{.seed = 1});
    model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2});
    model->build(Shape{20});
    optimizer = std::make_unique<optim::Adam>(0.01f);
  }
  if (args.gpu) {  // TensorFlow's layout: the workers compute on the GPU, the chief keeps host memory
    ASSERT_EQ(model->device(), strategy.task().type == "worker" ? Device::cuda(0) : Device::cpu()) << me;
  }
  auto per_worker = coordinator.create_per_worker_dataset([&] {
    data::Split d = data::make_synthetic(256, 20, 10, 3 + static_cast<std::uint64_t>(strategy.task().index),
                                         data::SyntheticLabels::teacher);
    return data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).repeat();
  });
  losses::SparseCategoricalCrossentropy loss_fn(false);
  int closures = 0;
  auto train_step = coordinator.define("train_step", [&](data::Iterator& it) {
    ++closures;
    const bool fault = closures == args.fault_at;
    if (fault && me == args.stop_task) ::raise(SIGSTOP);
    std::optional<data::Element> batch = it.next();
    const auto vars = model->trainable_variables();
    GradientTape tape;
    const Device device = model->device();  // a GPU worker's batch goes to its GPU
    Tensor loss = loss_fn((*batch)[1].to(device), (*model)((*batch)[0].to(device), true));
    optimizer->apply_gradients(tape.gradient(loss, vars), vars);
    if (fault && me == args.kill_task) ::raise(SIGKILL);
    return std::vector<Tensor>{loss};
  });
  if (strategy.task().type == "worker") {
    coordinator.serve();
    return;
  }
  coordinator.wait_for_workers(strategy.num_workers());  // the planted fault needs worker:1 at work
  auto it = per_worker.iterator();
  std::vector<distribute::RemoteValue> values;
  for (int s = 0; s < args.steps; ++s) values.push_back(coordinator.schedule(train_step, it));
  if (args.chief_dies_after > 0) {
    values.at(static_cast<std::size_t>(args.chief_dies_after - 1)).fetch();
    ::raise(SIGKILL);
  }
  coordinator.join();
  if (args.then_steps > 0) {
    coordinator.wait_for_workers(strategy.num_workers());
    for (int s = 0; s < args.then_steps; ++s) values.push_back(coordinator.schedule(train_step, it));
    coordinator.join();
  }
  // Every closure has its result, the loss of one batch, however often it ran: a finite
  // scalar. Anything else fails the task, and with it the parent test.
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::vector<Tensor>& result = values[i].fetch();
    ASSERT_EQ(result.size(), 1u) << "closure " << i;
    ASSERT_EQ(result[0].numel(), 1) << "closure " << i;
    EXPECT_TRUE(std::isfinite(result[0].item())) << "closure " << i << " returned loss " << result[0].item();
  }
  const auto st = coordinator.statistics();
  std::printf("stats scheduled=%lld finished=%lld rerun=%lld lost=%lld applied=%lld refused=%lld",
              static_cast<long long>(st.closures_scheduled), static_cast<long long>(st.closures_finished),
              static_cast<long long>(st.closures_rerun), static_cast<long long>(st.workers_lost),
              static_cast<long long>(st.pushes_applied), static_cast<long long>(st.pushes_refused));
  for (std::size_t w = 0; w < st.closures_per_worker.size(); ++w)
    std::printf(" worker%zu=%lld", w, static_cast<long long>(st.closures_per_worker[w]));
  std::printf("\n");
  std::fflush(stdout);
  return;
}

Args args;

// The task as one test: an error (a failed check, or an exception such as the coordinator
// falling silent) fails it, and the process exits 1.
TEST(PsTask, PlaysItsPart) { run(args); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ps_task: " << e.what() << "\n";
    return 1;
  }
  return RUN_ALL_TESTS();
}
