// The seeds' larger model with model.fit: 1024 -> Dense(1024, relu) -> Dense(1024, relu)
// -> Dense(10, softmax), 10000 random samples, batch 64, Adam. The per-epoch line shows
// the step time this machine gives a 2.1 M-parameter model.
//
//   ./seed_large [--epochs N]
#include <cstdio>

#include "dtrain/dtrain.h"
#include "example_main.h"

int main(int argc, char** argv) {
  using namespace dtrain;
  return example::run([&] {
    const int epochs = example::int_flag(argc, argv, "--epochs", 2);
    set_random_seed(0);
    data::Split d = data::make_synthetic(10000, 1024, 10, 0);
    Sequential model;
    model.add<nn::Dense>(1024, "relu");
    model.add<nn::Dense>(1024, "relu");
    model.add<nn::Dense>(10, "softmax");
    model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    History h = model.fit(d.x, d.y, {.epochs = epochs, .batch_size = 64});
    std::printf("steady-state throughput: %.0f samples/s\n", h.samples_per_second.back());
  });
}
