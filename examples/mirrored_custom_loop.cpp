// The seeds' custom training loop under MirroredStrategy: the dataset is distributed
// (each global batch split across the replicas), strategy.run runs the step on every
// replica at once, and apply_gradients inside the step sums the replicas' gradients
// before the single update of the shared weights. strategy.reduce(SUM) adds up the
// replicas' losses, each already divided by the global batch (compute_average_loss).
//
//   ./mirrored_custom_loop [--replicas N] [--epochs N]
#include <cstdio>

#include "dtrain/dtrain.h"
#include "example_main.h"

using namespace dtrain;

int main(int argc, char** argv) {
  return example::run([&] {
    const int replicas = example::int_flag(argc, argv, "--replicas", 2);
    const int epochs = example::int_flag(argc, argv, "--epochs", 5);
    distribute::MirroredStrategy strategy(replicas);
    const std::int64_t global_batch = 32 * strategy.num_replicas_in_sync();

    set_random_seed(0);
    std::unique_ptr<Sequential> model;
    std::unique_ptr<optim::Adam> optimizer;
    {
      auto scope = strategy.scope();
      model = std::make_unique<Sequential>();
      model->add<nn::Dense>(64, "relu");
      model->add<nn::Dense>(10, "softmax");
      model->build(Shape{100});
      optimizer = std::make_unique<optim::Adam>();
    }
    // Per-example losses, so that each replica can divide by the global batch.
    losses::SparseCategoricalCrossentropy loss_fn(false, losses::Reduction::none);
    const std::vector<Variable*> vars = model->trainable_variables();

    auto train_step = [&](const data::Element& batch) {
      GradientTape tape;
      Tensor predictions = (*model)(batch[0], /*training=*/true);
      Tensor loss = distribute::compute_average_loss(loss_fn(batch[1], predictions), global_batch);
      optimizer->apply_gradients(tape.gradient(loss, vars), vars);
      return loss;
    };

    data::Split d = data::make_synthetic(4096, 100, 10, /*seed=*/2024, data::SyntheticLabels::teacher);
    data::Dataset dataset = data::Dataset::from_tensor_slices({d.x, d.y}).shuffle(4096, 1).batch(global_batch);
    distribute::DistributedDataset distributed = strategy.experimental_distribute_dataset(dataset);

    for (int epoch = 1; epoch <= epochs; ++epoch) {
      double total = 0;
      int batches = 0;
      for (const auto& batch : distributed) {
        distribute::PerReplica<Tensor> losses = strategy.run(train_step, batch);
        total += strategy.reduce(distribute::ReduceOp::SUM, losses).item();
        ++batches;
      }
      metrics::SparseCategoricalAccuracy accuracy;
      accuracy.update_state(d.y, (*model)(d.x));
      std::printf("epoch %d: loss %.4f, accuracy %.3f (%d replicas, %d global batches)\n", epoch, total / batches,
                  accuracy.result(), strategy.num_replicas_in_sync(), batches);
    }
  });
}
