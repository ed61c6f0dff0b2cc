// The seeds' custom training loop in C++: a Dense(64, relu) -> Dense(10, softmax) model,
// Adam, SparseCategoricalCrossentropy, GradientTape. The data is synthetic and learnable:
// labels come from a fixed random "teacher" network, so accuracy climbs as it trains.
//
//   ./custom_loop_mlp [--quick] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "dtrain/dtrain.h"
#include "example_main.h"

using namespace dtrain;

int main(int argc, char** argv) {
  return example::run([&] {
    const int epochs = example::has_flag(argc, argv, "--quick") ? 3 : 20;
    set_num_threads(example::int_flag(argc, argv, "--threads", 0));
    // 1000 rows of 100 normal inputs; labels from a fixed random linear "teacher".
    data::Split d = data::make_synthetic(1000, 100, 10, /*seed=*/2024, data::SyntheticLabels::teacher);
    const Tensor& x = d.x;
    const Tensor& y = d.y;
    const std::int64_t batch = 32;

    set_random_seed(0);
    nn::Dense hidden(64, "relu");
    nn::Dense output(10, "softmax");
    auto model = [&](const Tensor& in, bool training) { return output(hidden(in, training), training); };
    optim::Adam optimizer;  // Keras defaults: learning rate 1e-3
    losses::SparseCategoricalCrossentropy loss_fn;
    std::vector<Variable*> vars;

    std::printf("dtrain %s | threads %d | 1000 samples, batch %lld\n", "custom training loop", num_threads(),
                static_cast<long long>(batch));
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      metrics::Mean mean_loss;
      metrics::SparseCategoricalAccuracy accuracy;
      const auto start = std::chrono::steady_clock::now();
      for (std::int64_t b = 0; b < x.dim(0); b += batch) {
        const std::int64_t e = std::min(b + batch, x.dim(0));
        Tensor xb = x.slice(b, e), yb = y.slice(b, e);
        GradientTape tape;
        Tensor probs = model(xb, true);
        Tensor loss = loss_fn(yb, probs);
        if (vars.empty()) {
          for (Variable* v : hidden.trainable_variables()) vars.push_back(v);
          for (Variable* v : output.trainable_variables()) vars.push_back(v);
        }
        optimizer.apply_gradients(tape.gradient(loss, vars), vars);
        mean_loss.update_state(loss.item(), static_cast<double>(e - b));
        accuracy.update_state(yb, probs);
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("epoch %2d  loss %.4f  accuracy %.4f  %8.0f samples/s\n", epoch, mean_loss.result(),
                  accuracy.result(), static_cast<double>(x.dim(0)) / seconds);
    }
  });
}
