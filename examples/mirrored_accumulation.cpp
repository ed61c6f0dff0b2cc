// Gradient accumulation under MirroredStrategy, two ways, from the same start:
// - the seeds' way: strategy.run returns each replica's gradients, strategy.reduce(SUM)
//   adds them up every micro-batch, and the sums are applied every accum_steps batches;
// - GradientAccumulator: each replica keeps its own sums and they are reduced once per
//   accum_steps batches (PyTorch's no_sync), a quarter of the communication for 4 steps.
// Both give the same weights, which the example checks.
//
//   ./mirrored_accumulation [--replicas N] [--accum-steps K]
#include <cmath>
#include <cstdio>

#include "dtrain/dtrain.h"
#include "example_main.h"

using namespace dtrain;

namespace {

struct Trained {
  std::vector<std::vector<float>> weights;
  int updates = 0;
};

}  // namespace

int main(int argc, char** argv) {
  return example::run([&] {
    const int replicas = example::int_flag(argc, argv, "--replicas", 2);
    const int accum_steps = std::max(1, example::int_flag(argc, argv, "--accum-steps", 4));
    distribute::MirroredStrategy strategy(replicas);
    const std::int64_t micro_batch = 16 * strategy.num_replicas_in_sync();
    data::Split d = data::make_synthetic(2048, 100, 10, /*seed=*/5, data::SyntheticLabels::teacher);
    data::Dataset dataset = data::Dataset::from_tensor_slices({d.x, d.y}).batch(micro_batch);
    losses::SparseCategoricalCrossentropy loss_fn(false, losses::Reduction::none);

    auto train = [&](bool reduce_every_step) {
      std::unique_ptr<Sequential> model;
      std::unique_ptr<optim::Adam> optimizer;
      {
        auto scope = strategy.scope();
        model = std::make_unique<Sequential>();
        model->add<nn::Dense>(64, "relu", nn::DenseOptions{.seed = 1});
        model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2});
        model->build(Shape{100});
        optimizer = std::make_unique<optim::Adam>();
      }
      const std::vector<Variable*> vars = model->trainable_variables();
      auto gradients = [&](const data::Element& batch) {
        GradientTape tape;
        Tensor loss = distribute::compute_average_loss(loss_fn(batch[1], (*model)(batch[0], true)), micro_batch);
        return tape.gradient(loss, vars);
      };
      Trained out;
      distribute::GradientAccumulator accumulator(strategy, accum_steps);
      std::vector<Tensor> accumulated;
      int i = 0;
      for (const auto& batch : strategy.experimental_distribute_dataset(dataset)) {
        if (reduce_every_step) {
          // grad = strategy.reduce(SUM, per_replica_gradients) every micro-batch
          std::vector<Tensor> grad = strategy.reduce(distribute::ReduceOp::SUM, strategy.run(gradients, batch));
          if (accumulated.empty()) accumulated = grad;
          else
            for (std::size_t k = 0; k < grad.size(); ++k) accumulated[k] = accumulated[k] + grad[k];
          if (++i % accum_steps == 0) {
            for (Tensor& g : accumulated) g = g * (1.0f / static_cast<float>(accum_steps));
            optimizer->apply_gradients(accumulated, vars);
            accumulated.clear();
            ++out.updates;
          }
        } else {
          strategy.run([&](const data::Element& b) { accumulator.accumulate(gradients(b)); }, batch);
          if (accumulator.ready()) {
            optimizer->apply_gradients(accumulator.reduce(distribute::ReduceOp::SUM), vars);
            ++out.updates;
          }
        }
      }
      for (Variable* v : vars) out.weights.push_back(v->value().to_vector());
      return out;
    };

    const Trained every_step = train(true), once_per_group = train(false);
    double worst = 0;
    for (std::size_t v = 0; v < every_step.weights.size(); ++v)
      for (std::size_t k = 0; k < every_step.weights[v].size(); ++k)
        worst = std::max(worst, static_cast<double>(std::fabs(every_step.weights[v][k] - once_per_group.weights[v][k])));
    std::printf("%d replicas, micro-batch %lld, %d micro-batches per update: %d updates each way\n",
                strategy.num_replicas_in_sync(), static_cast<long long>(micro_batch), accum_steps, every_step.updates);
    std::printf("reduce every micro-batch vs once per update: largest weight difference %.2e\n", worst);
    if (every_step.updates != once_per_group.updates || worst > 1e-5)
      throw InvalidArgument("the two ways of accumulating disagree");
  });
}
