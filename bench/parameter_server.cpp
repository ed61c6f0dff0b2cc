// ParameterServerStrategy's throughput on the seeds' large MLP (Adam, batch 64 per
// closure): every task runs this program under `dtrain launch --chief --workers N --ps M`;
// the chief schedules --warmup then --steps closures and prints one line:
//   ParameterServerStrategy <mode> <samples/s> samples/s, <pushes> pushes applied, staleness p50 <s> max <s>
// A straggler (--slow-worker K --slow-factor F) repeats its forward and backward F times.
// --push-only MB: instead, a model of one MB-megabyte variable whose closures compute
// nothing (a gradient of ones, plain SGD): each closure is one pull and one push, and the
// line gives closures/s and the megabytes/s they moved both ways.
// --shared-memory 0: values and gradients through gRPC even where the tasks share a host.
// --embedding VOCAB: instead, a bag-of-ids classifier (Embedding(VOCAB, 64), mean over 32
// ids, Dense(10); Adam) whose table is split over every ps, on ids skewed toward the
// small ones as words are; --embedding-rows 0 pulls and pushes the table whole (the
// default moves only the rows each batch looks up). Its line adds the MB each step moved.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "models.h"

namespace {

using namespace dtrain;
using Clock = std::chrono::steady_clock;

struct Args {
  int steps = 200, warmup = 20, batch = 64;
  std::string mode = "async";
  int slow_worker = -1, slow_factor = 1;
  int push_only_mb = 0;
  bool shared_memory = true;
  std::int64_t embedding = 0;
  bool embedding_rows = true;
};

distribute::Consistency parse_mode(const std::string& m) {
  if (m == "async") return distribute::Consistency::async();
  if (m.rfind("ssp", 0) == 0) return distribute::Consistency::ssp(std::stoi(m.substr(3)));
  if (m.rfind("sync", 0) == 0) return distribute::Consistency::sync(m.size() > 4 ? std::stoi(m.substr(4)) : 0);
  throw InvalidArgument("--mode: async, sspK or syncB, not " + m);
}

int run(const Args& args) {
  distribute::ParameterServerOptions options;
  options.consistency = parse_mode(args.mode);
  options.shared_memory = args.shared_memory;
  options.embedding_rows = args.embedding_rows;
  constexpr std::int64_t kIds = 32;
  if (args.embedding > 0)
    options.variable_partitioner =
        distribute::FixedShardsPartitioner(cluster::tf_config_from_environment().cluster.num_tasks("ps"));
  distribute::ParameterServerStrategy strategy(options);
  distribute::ClusterCoordinator coordinator(strategy);
  if (strategy.task().type == "ps") return coordinator.serve(), 0;
  std::unique_ptr<Sequential> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::vector<Tensor> ones;
  {
    auto scope = strategy.scope();
    if (args.push_only_mb > 0) {
      // A [MB * 1024, 256] float32 kernel: MB megabytes.
      model = std::make_unique<Sequential>();
      model->add<nn::Dense>(256, "linear", nn::DenseOptions{.use_bias = false, .seed = 1});
      model->build(Shape{std::int64_t{args.push_only_mb} * 1024});
      optimizer = std::make_unique<optim::SGD>(1e-6f);
      for (Variable* v : model->trainable_variables()) ones.push_back(Tensor::full(v->shape(), 1.0f));
    } else if (args.embedding > 0) {
      model = std::make_unique<Sequential>();
      model->add<nn::Embedding>(args.embedding, 64, nn::EmbeddingOptions{.seed = 1});
      model->add<nn::GlobalAveragePooling1D>();
      model->add<nn::Dense>(10, "linear", nn::DenseOptions{.seed = 2});
      model->build(Shape{kIds});
      optimizer = std::make_unique<optim::Adam>(1e-3f);
    } else {
      model = bench::large_mlp();
      optimizer = std::make_unique<optim::Adam>(1e-3f);
    }
  }
  const int me = strategy.task().index;
  auto per_worker = coordinator.create_per_worker_dataset([&] {
    if (args.embedding > 0) {
      // Ids VOCAB * u^3 for u uniform in [0, 1): most fall among the first rows.
      const std::int64_t rows = 16 * args.batch;
      const Generator g(1 + static_cast<std::uint64_t>(me));
      std::vector<float> ids(static_cast<std::size_t>(rows * kIds)), labels(static_cast<std::size_t>(rows));
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const float x = g.uniform_at(i);
        ids[i] = std::min(std::floor(static_cast<float>(args.embedding) * x * x * x), static_cast<float>(args.embedding - 1));
      }
      for (std::size_t r = 0; r < labels.size(); ++r)
        labels[r] = static_cast<float>(static_cast<std::int64_t>(ids[r * kIds]) % 10);
      return data::Dataset::from_tensor_slices({Tensor::from_vector(Shape{rows, kIds}, ids),
                                                Tensor::from_vector(Shape{rows}, labels)})
          .batch(args.batch)
          .repeat();
    }
    data::Split d = data::make_synthetic(16 * args.batch, 1024, 10, 1 + static_cast<std::uint64_t>(me));
    return data::Dataset::from_tensor_slices({d.x, d.y}).batch(args.batch).repeat();
  });
  losses::SparseCategoricalCrossentropy loss_fn(/*from_logits=*/args.embedding > 0);
  const int repeats = strategy.task().type == "worker" && me == args.slow_worker ? args.slow_factor : 1;
  auto train_step = coordinator.define("train_step", [&](data::Iterator& it) {
    const auto vars = model->trainable_variables();
    if (args.push_only_mb > 0) {
      optimizer->apply_gradients(ones, vars);
      return std::vector<Tensor>{};
    }
    std::optional<data::Element> batch = it.next();
    std::vector<Tensor> grads;
    for (int r = 0; r < repeats; ++r) {
      GradientTape tape;
      Tensor loss = loss_fn((*batch)[1], (*model)((*batch)[0], true));
      grads = tape.gradient(loss, vars);
    }
    optimizer->apply_gradients(grads, vars);
    return std::vector<Tensor>{};
  });
  if (strategy.task().type == "worker") return coordinator.serve(), 0;
  coordinator.wait_for_workers(strategy.num_workers());
  auto it = per_worker.iterator();
  for (int s = 0; s < args.warmup; ++s) coordinator.schedule(train_step, it);
  coordinator.join();
  const auto start = Clock::now();
  for (int s = 0; s < args.steps; ++s) coordinator.schedule(train_step, it);
  coordinator.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto st = coordinator.statistics();
  if (args.embedding > 0) {
    std::printf("ParameterServerStrategy embedding %lld x 64 (%s): %.0f samples/s, %.2f MB moved a step\n",
                static_cast<long long>(args.embedding), args.embedding_rows ? "rows looked up" : "whole table",
                args.steps * args.batch / seconds,
                static_cast<double>(st.shared_memory_bytes + st.message_bytes) / 1e6 / (args.warmup + args.steps));
    return 0;
  }
  if (args.push_only_mb > 0) {
    std::printf("ParameterServerStrategy push-only %d MB: %.1f closures/s, %.0f MB/s pulled and pushed\n",
                args.push_only_mb, args.steps / seconds, 2.0 * args.push_only_mb * args.steps / seconds);
    return 0;
  }
  std::int64_t total = 0, max_staleness = 0, median = -1, seen = 0;
  for (std::size_t s = 0; s < st.staleness_counts.size(); ++s) {
    total += st.staleness_counts[s];
    if (st.staleness_counts[s] > 0) max_staleness = static_cast<std::int64_t>(s);
  }
  for (std::size_t s = 0; s < st.staleness_counts.size() && median < 0; ++s)
    if ((seen += st.staleness_counts[s]) * 2 >= total) median = static_cast<std::int64_t>(s);
  std::printf("ParameterServerStrategy %s %.0f samples/s, %lld pushes applied, %lld dropped, staleness p50 %lld max %lld\n",
              options.consistency.description().c_str(), args.steps * args.batch / seconds,
              static_cast<long long>(st.pushes_applied), static_cast<long long>(st.pushes_dropped),
              static_cast<long long>(median), static_cast<long long>(max_staleness));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--steps") a.steps = std::stoi(v);
      else if (k == "--warmup") a.warmup = std::stoi(v);
      else if (k == "--batch") a.batch = std::stoi(v);
      else if (k == "--mode") a.mode = v;
      else if (k == "--slow-worker") a.slow_worker = std::stoi(v);
      else if (k == "--slow-factor") a.slow_factor = std::stoi(v);
      else if (k == "--push-only") a.push_only_mb = std::stoi(v);
      else if (k == "--shared-memory") a.shared_memory = v != "0";
      else if (k == "--embedding") a.embedding = std::stoll(v);
      else if (k == "--embedding-rows") a.embedding_rows = v != "0";
      else throw InvalidArgument("bench_parameter_server: unknown option " + k);
    }
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_parameter_server: %s\n", e.what());
    return 1;
  }
}
