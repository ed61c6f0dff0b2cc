// The seeds' first example with model.fit: Dense(64, relu) -> Dense(10, softmax) on 1000
// random normal samples with random labels, batch 32, Adam. (Random labels cannot be
// learned; the seeds use this model to show fixed costs, not accuracy.)
//
//   ./seed_small [--epochs N]
#include <cstdio>

#include "dtrain/dtrain.h"
#include "example_main.h"

int main(int argc, char** argv) {
  using namespace dtrain;
  return example::run([&] {
    const int epochs = example::int_flag(argc, argv, "--epochs", 2);
    set_random_seed(0);
    data::Split d = data::make_synthetic(/*samples=*/1000, /*features=*/100, /*classes=*/10, /*seed=*/0);

    Sequential model;
    model.add<nn::Dense>(64, "relu");
    model.add<nn::Dense>(10, "softmax");
    model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    model.build({100});
    std::printf("%s", model.summary().c_str());

    History h = model.fit(d.x, d.y, {.epochs = epochs, .batch_size = 32});
    std::printf("steady-state throughput: %.0f samples/s\n", h.samples_per_second.back());
  });
}
