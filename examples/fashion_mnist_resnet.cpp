// A small residual network on Fashion-MNIST, built with the functional API: a 3x3 stem,
// three stages of two residual blocks (16, 32 and 64 filters; the second and third stages
// halve the image with a strided block whose shortcut is a 1x1 convolution), batch
// normalization after every convolution, global average pooling and a 10-way classifier.
// Adam with a cosine-decayed learning rate, batch 128.
//
//   ./fashion_mnist_resnet [--epochs N] [--steps-per-epoch N] [--synchronized]
//   ./fashion_mnist_resnet --print-config     (the same model as a dtrain config's "model")
#include <cstdio>
#include <iostream>

#include "dtrain/dtrain.h"
#include "example_main.h"

namespace {

using namespace dtrain;

KerasTensor conv_bn(const KerasTensor& x, std::int64_t filters, std::int64_t kernel, std::int64_t stride, bool relu,
                    bool synchronized) {
  KerasTensor y = layer<nn::Conv2D>(filters, kernel,
                                    nn::Conv2DOptions{.strides = {stride, stride}, .padding = "same",
                                                      .use_bias = false, .kernel_initializer = "he_normal"})(x);
  y = layer<nn::BatchNormalization>(nn::BatchNormalizationOptions{.synchronized = synchronized})(y);
  return relu ? layer<nn::Activation>("relu")(y) : y;
}

// conv-BN-relu, conv-BN, plus the shortcut (projected when the shape changes), then relu.
KerasTensor residual_block(const KerasTensor& x, std::int64_t filters, std::int64_t stride, bool synchronized) {
  const KerasTensor y = conv_bn(conv_bn(x, filters, 3, stride, true, synchronized), filters, 3, 1, false, synchronized);
  const KerasTensor shortcut = stride == 1 && x.shape()[3] == filters ? x : conv_bn(x, filters, 1, stride, false, synchronized);
  return layer<nn::Activation>("relu")(layer<nn::Add>()({shortcut, y}));
}

std::unique_ptr<Model> resnet(bool synchronized) {
  const KerasTensor images = Input({784}, "image");
  KerasTensor x = layer<nn::Reshape>(std::vector<std::int64_t>{28, 28, 1})(images);
  x = conv_bn(x, 16, 3, 1, true, synchronized);
  for (const std::int64_t filters : {16, 32, 64})
    for (int block = 0; block < 2; ++block)
      x = residual_block(x, filters, block == 0 && filters != 16 ? 2 : 1, synchronized);
  x = layer<nn::GlobalAveragePooling2D>()(x);
  const KerasTensor logits = layer<nn::Dense>(10)(x);
  return std::make_unique<Model>(images, logits, "fashion_mnist_resnet");
}

}  // namespace

int main(int argc, char** argv) {
  return example::run([&] {
    set_random_seed(0);
    const bool synchronized = example::has_flag(argc, argv, "--synchronized");
    std::unique_ptr<Model> model = resnet(synchronized);
    if (example::has_flag(argc, argv, "--print-config")) {
      std::cout << model->to_json() << "\n";
      return;
    }
    const int epochs = example::int_flag(argc, argv, "--epochs", 12);
    const int steps = example::int_flag(argc, argv, "--steps-per-epoch", 0);
    data::Classification fm = data::load_fashion_mnist();
    const std::int64_t per_epoch = steps > 0 ? steps : (fm.train.x.dim(0) + 127) / 128;
    auto schedule = std::make_shared<optim::CosineDecay>(2e-3f, per_epoch * epochs);
    model->compile(std::make_shared<optim::Adam>(schedule),
                   std::make_shared<losses::SparseCategoricalCrossentropy>(/*from_logits=*/true), {"accuracy"});
    std::cout << model->summary();
    FitOptions fit{.epochs = epochs, .batch_size = 128, .seed = 0};
    if (steps > 0) {
      fit.epochs = 1;
      const std::int64_t rows = std::min<std::int64_t>(fm.train.x.dim(0), steps * std::int64_t{128});
      model->fit(fm.train.x.slice(0, rows), fm.train.y.slice(0, rows), fit);
    } else {
      model->fit(fm.train.x, fm.train.y, fit);
    }
    Logs test = model->evaluate(fm.test.x, fm.test.y, {.batch_size = 500});
    std::printf("test loss %.4f, test accuracy %.4f\n", test.at("loss"), test.at("accuracy"));
  });
}
