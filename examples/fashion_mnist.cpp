// Fashion-MNIST in about thirty lines: 784 -> Dense(256, relu) -> Dense(128, relu) -> 10,
// Adam 1e-3, batch 128, from Debian's dataset-fashion-mnist package.
//
//   ./fashion_mnist [--epochs N]      (DTRAIN_FASHION_MNIST_DIR points elsewhere)
#include <cstdio>

#include "dtrain/dtrain.h"
#include "example_main.h"

int main(int argc, char** argv) {
  using namespace dtrain;
  return example::run([&] {
    const int epochs = example::int_flag(argc, argv, "--epochs", 10);
    set_random_seed(0);
    data::Classification fm = data::load_fashion_mnist();

    Sequential model;
    model.add<nn::Dense>(256, "relu");
    model.add<nn::Dense>(128, "relu");
    model.add<nn::Dense>(10);  // logits
    model.compile(std::make_shared<optim::Adam>(1e-3f),
                  std::make_shared<losses::SparseCategoricalCrossentropy>(/*from_logits=*/true), {"accuracy"});

    model.fit(fm.train.x, fm.train.y, {.epochs = epochs, .batch_size = 128, .validation_split = 0.1});
    Logs test = model.evaluate(fm.test.x, fm.test.y, {.batch_size = 1000});
    std::printf("test loss %.4f, test accuracy %.4f\n", test.at("loss"), test.at("accuracy"));
  });
}
