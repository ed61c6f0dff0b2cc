// The seeds' multi-replica Keras example: build and compile the model inside
// strategy.scope(), then fit with the global batch scaled by the number of replicas.
// Each replica is a logical CPU device (a thread with its share of the cores).
//
//   ./mirrored_fit [--replicas N] [--epochs N]
#include <cstdio>

#include "dtrain/dtrain.h"
#include "example_main.h"

using namespace dtrain;

int main(int argc, char** argv) {
  return example::run([&] {
    const int replicas = example::int_flag(argc, argv, "--replicas", 0);
    const int epochs = example::int_flag(argc, argv, "--epochs", 5);
    // strategy = tf.distribute.MirroredStrategy()  (one replica per core by default)
    distribute::MirroredStrategy strategy = replicas > 0 ? distribute::MirroredStrategy(replicas)
                                                         : distribute::MirroredStrategy();
    std::printf("Number of devices: %d (%d thread(s) each)\n", strategy.num_replicas_in_sync(),
                strategy.threads_per_replica());

    data::Split d = data::make_synthetic(8192, 100, 10, /*seed=*/7, data::SyntheticLabels::teacher);
    set_random_seed(0);
    Sequential model;
    {
      auto scope = strategy.scope();  // with strategy.scope():
      model.add<nn::Dense>(256, "relu");
      model.add<nn::Dense>(10, "softmax");
      model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    }
    FitOptions options;
    options.epochs = epochs;
    options.batch_size = 32 * strategy.num_replicas_in_sync();  // the global batch
    options.verbose = 2;
    History h = model.fit(d.x, d.y, options);
    std::printf("final accuracy %.3f, %.0f samples/s in the last epoch\n", h.history.at("accuracy").back(),
                h.samples_per_second.back());
  });
}
