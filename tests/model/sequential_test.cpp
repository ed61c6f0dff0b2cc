#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/storage_watch.h"
#include "dtrain/data/datasets.h"
#include "dtrain/model/sequential.h"

namespace dtrain {
namespace {

std::unique_ptr<Sequential> small_model(std::uint64_t seed) {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(16, "relu", nn::DenseOptions{.seed = seed});
  m->add<nn::Dense>(3, "", nn::DenseOptions{.seed = seed + 1});
  return m;
}

TEST(Sequential, DuplicateNamesGetSuffixes) {
  Sequential m;
  m.add<nn::Dense>(4);
  m.add<nn::Dense>(4);
  m.add<nn::Dense>(2);
  EXPECT_EQ(m.layers()[0]->name(), "dense");
  EXPECT_EQ(m.layers()[1]->name(), "dense_1");
  EXPECT_EQ(m.layers()[2]->name(), "dense_2");
}

TEST(Sequential, TheSameLayerTwiceIsAnError) {
  Sequential m;
  auto d = std::make_shared<nn::Dense>(4);
  m.add(d);
  EXPECT_THROW(m.add(d), InvalidArgument);
  EXPECT_EQ(m.layers().size(), 1u);
}

TEST(Sequential, ABadInputShapeLeavesTheModelUnbuilt) {
  Sequential m;
  m.add<nn::Activation>("relu");
  m.add<nn::Dense>(3);
  EXPECT_THROW(m.build(Shape{}), InvalidArgument);  // inputs [batch]: Dense needs [batch, features]
  EXPECT_FALSE(m.built());
  m.build({5});  // the activation layer was not left built for the bad shape
  EXPECT_EQ(m.output_shape(), Shape({1, 3}));
}

TEST(Sequential, SummaryTableLikeKeras) {
  Sequential m;
  m.add<nn::Dense>(64, "relu");
  m.add<nn::Dense>(10, "softmax");
  EXPECT_THROW(m.summary(), InvalidArgument);  // not built yet
  m.build({100});
  const std::string s = m.summary();
  EXPECT_NE(s.find("Model: \"sequential\""), std::string::npos) << s;
  EXPECT_NE(s.find("dense (Dense)"), std::string::npos) << s;
  EXPECT_NE(s.find("(None, 64)"), std::string::npos) << s;
  EXPECT_NE(s.find("6,464"), std::string::npos) << s;  // 100*64 + 64
  EXPECT_NE(s.find("650"), std::string::npos) << s;    // 64*10 + 10
  EXPECT_NE(s.find("Total params: 7,114"), std::string::npos) << s;
  EXPECT_EQ(m.count_params(), 7114);
  EXPECT_EQ(m.output_shape(), Shape({1, 10}));
}

TEST(Sequential, FitLearnsAndReportsHistory) {
  data::Split d = data::make_synthetic(3000, 10, 3, 1, data::SyntheticLabels::teacher);
  auto m = small_model(5);
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, /*from_logits=*/true);
  std::ostringstream out;
  History h = m->fit(d.x, d.y, {.epochs = 10, .batch_size = 32, .validation_split = 0.2, .verbose = 0, .out = &out});
  EXPECT_EQ(h.epoch, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"}) ASSERT_EQ(h.history[k].size(), 10u) << k;
  EXPECT_LT(h.history["loss"].back(), 0.5 * h.history["loss"].front());
  EXPECT_GT(h.history["val_accuracy"].back(), 0.9);
  EXPECT_EQ(h.samples_per_second.size(), 10u);
  EXPECT_TRUE(out.str().empty());  // verbose 0 prints nothing
  // validation_split held out the last 20%: evaluating on it gives the same val figures.
  Logs v = m->evaluate(d.x.slice(2400, 3000), d.y.slice(2400, 3000), {.batch_size = 32});
  EXPECT_NEAR(v.at("loss"), h.history["val_loss"].back(), 1e-5);
  EXPECT_NEAR(v.at("accuracy"), h.history["val_accuracy"].back(), 1e-12);
}

// fit's steps leave nothing holding a variable's storage at the update (a tape's record, a
// cached read), so each update writes in place and copies no variable: checked after
// every batch, where an allocator handing two blocks back and forth could hide a copy.
TEST(Sequential, FitUpdatesTheVariablesInPlace) {
  data::Split d = data::make_synthetic(256, 10, 3, 4, data::SyntheticLabels::teacher);
  auto m = small_model(3);
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, true);
  m->fit(d.x, d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  std::vector<std::vector<float>> before;
  for (Variable* v : m->variables()) before.push_back(v->value().to_vector());
  auto watch = std::make_shared<testing::StorageWatch>();
  m->fit(d.x, d.y, {.epochs = 2, .batch_size = 32, .callbacks = {watch}, .verbose = 0});
  EXPECT_EQ(watch->batches, 16);
  EXPECT_EQ(watch->moves, 0);
  for (std::size_t i = 0; i < before.size(); ++i)
    EXPECT_NE(m->variables()[i]->value().to_vector(), before[i]) << m->variables()[i]->name();
}

TEST(Sequential, SameSeedSameNumbers) {
  data::Split d = data::make_synthetic(500, 10, 3, 2, data::SyntheticLabels::teacher);
  std::vector<double> losses[2];
  for (int run = 0; run < 2; ++run) {
    auto m = small_model(7);
    m->compile("adam", "sparse_categorical_crossentropy", {}, true);
    losses[run] = m->fit(d.x, d.y, {.epochs = 3, .batch_size = 50, .seed = 9, .verbose = 0}).history["loss"];
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(Sequential, FitEqualsACustomLoopOnTheSameBatches) {
  data::Split d = data::make_synthetic(96, 10, 3, 3, data::SyntheticLabels::teacher);
  auto a = small_model(11), b = small_model(11);
  a->compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  a->fit(d.x, d.y, {.epochs = 1, .batch_size = 32, .shuffle = false, .verbose = 0});
  b->build({10});
  optim::SGD sgd(0.1f);
  losses::SparseCategoricalCrossentropy loss_fn(true);
  auto vars = b->trainable_variables();
  for (std::int64_t s = 0; s < 96; s += 32) {
    GradientTape tape;
    Tensor loss = loss_fn(d.y.slice(s, s + 32), (*b)(d.x.slice(s, s + 32), true));
    sgd.apply_gradients(tape.gradient(loss, vars), vars);
  }
  auto va = a->variables(), vb = b->variables();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i]->value().to_vector(), vb[i]->value().to_vector()) << va[i]->name();
}

TEST(Sequential, FitOnADatasetEqualsFitOnTensors) {
  data::Split d = data::make_synthetic(100, 10, 3, 6, data::SyntheticLabels::teacher);
  auto a = small_model(21), b = small_model(21);
  for (auto* m : {a.get(), b.get()})
    m->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true), {"accuracy"});
  History ha = a->fit(d.x, d.y, {.epochs = 2, .batch_size = 16, .shuffle = false, .verbose = 0});
  data::Dataset ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(16).prefetch(data::AUTOTUNE);
  History hb = b->fit(ds, {.epochs = 2, .verbose = 0});
  EXPECT_EQ(ha.history["loss"], hb.history["loss"]);
  EXPECT_EQ(ha.history["accuracy"], hb.history["accuracy"]);
  auto va = a->variables(), vb = b->variables();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i]->value().to_vector(), vb[i]->value().to_vector());
  ASSERT_EQ(hb.input_wait_seconds.size(), 2u);
  EXPECT_GE(hb.input_wait_seconds[0], 0.0);
  Logs eval = b->evaluate(ds);
  Logs eval_t = b->evaluate(d.x, d.y, {.batch_size = 16});
  EXPECT_NEAR(eval.at("loss"), eval_t.at("loss"), 1e-6);
}

TEST(Sequential, BytesScaledByRescalingTrainLikeScaledFloats) {
  // Images kept as bytes through a shuffled pipeline, scaled by the model's first layer,
  // train exactly as the same images stored as floats / 255.
  data::Split d = data::make_synthetic(96, 12, 3, 8, data::SyntheticLabels::teacher);
  Tensor bytes = Tensor::empty(d.x.shape(), DType::u8), floats = Tensor::empty(d.x.shape());
  const float* x = d.x.data<float>();
  for (std::int64_t i = 0; i < d.x.numel(); ++i) {
    const auto b = static_cast<std::uint8_t>(std::clamp(128.0f + 40.0f * x[i], 0.0f, 255.0f));
    bytes.data<std::uint8_t>()[i] = b;
    floats.data<float>()[i] = static_cast<float>(b) * (1.0f / 255);
  }
  auto make = [](bool rescale) {
    auto m = std::make_unique<Sequential>();
    if (rescale) m->add<nn::Rescaling>(1.0f / 255);
    m->add<nn::Dense>(8, "relu", nn::DenseOptions{.seed = 1});
    m->add<nn::Dense>(3, "", nn::DenseOptions{.seed = 2});
    m->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
    return m;
  };
  auto a = make(true), b = make(false);
  auto pipeline = [&](const Tensor& images) {
    return data::Dataset::from_tensor_slices({images, d.y}).shuffle(96, 3).batch(16).prefetch(data::AUTOTUNE);
  };
  const History ha = a->fit(pipeline(bytes), {.epochs = 3, .verbose = 0});
  const History hb = b->fit(pipeline(floats), {.epochs = 3, .verbose = 0});
  EXPECT_EQ(ha.history.at("loss"), hb.history.at("loss"));
  auto va = a->variables(), vb = b->variables();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i]->value().to_vector(), vb[i]->value().to_vector()) << i;
  // And in tensors given to fit directly, and through JSON.
  auto c = make(true), e = make(false);
  c->fit(bytes, d.y, {.epochs = 1, .batch_size = 16, .verbose = 0});
  e->fit(floats, d.y, {.epochs = 1, .batch_size = 16, .verbose = 0});
  auto vc = c->variables(), ve = e->variables();
  for (size_t i = 0; i < vc.size(); ++i) EXPECT_EQ(vc[i]->value().to_vector(), ve[i]->value().to_vector()) << i;
  auto back = model_from_json(a->to_json());
  EXPECT_EQ(back->to_json(), a->to_json());
  EXPECT_NE(a->to_json().find("\"scale\": 0.003921"), std::string::npos) << a->to_json();
}

TEST(Sequential, FitOnARepeatedDatasetWithStepsPerEpoch) {
  data::Split d = data::make_synthetic(64, 10, 3, 7);
  auto m = small_model(2);
  m->compile("sgd", "sparse_categorical_crossentropy", {}, true);
  int batches = 0;
  auto count = std::make_shared<LambdaCallback>();
  count->batch_end = [&](std::int64_t, const Logs&) { ++batches; };
  data::Dataset ds = data::Dataset::from_tensor_slices({d.x, d.y}).shuffle(64, 1).batch(16).repeat();
  data::Dataset val = data::Dataset::from_tensor_slices({d.x, d.y}).batch(32);
  History h = m->fit(ds, {.epochs = 3, .validation_dataset = val, .steps_per_epoch = 5, .callbacks = {count}, .verbose = 0});
  EXPECT_EQ(batches, 15);
  EXPECT_EQ(h.history["val_loss"].size(), 3u);
  // A finite dataset that runs out before steps_per_epoch is an error that says what to do.
  data::Dataset short_ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(16);
  try {
    m->fit(short_ds, {.epochs = 2, .steps_per_epoch = 5, .verbose = 0});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(".repeat()"), std::string::npos) << e.what();
  }
}

TEST(Sequential, FitOnUnbatchedOrUnpairedDatasetIsAClearError) {
  data::Split d = data::make_synthetic(8, 10, 3, 8);
  auto m = small_model(3);
  m->compile("sgd", "sparse_categorical_crossentropy", {}, true);
  try {
    m->fit(data::Dataset::from_tensor_slices({d.x, d.y}), {.verbose = 0});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(".batch(n)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m->fit(data::Dataset::from_tensor_slices({d.x}).batch(4), {.verbose = 0}), InvalidArgument);
}

TEST(Sequential, PredictMatchesCallAndHandlesShortLastBatch) {
  auto m = small_model(3);
  Tensor x = data::make_synthetic(10, 10, 3, 4).x;
  Tensor p = m->predict(x, 4);
  EXPECT_EQ(p.shape(), Shape({10, 3}));
  // Equal up to rounding: some CPUs' kernels (oneDNN's AVX2 ones) order a row's sums by
  // how many rows the call has.
  const std::vector<float> batched = p.to_vector(), whole = (*m)(x).to_vector();
  for (std::size_t i = 0; i < whole.size(); ++i)
    EXPECT_NEAR(batched[i], whole[i], 1e-6f * std::max(1.0f, std::abs(whole[i]))) << "element " << i;
}

TEST(Sequential, ProgressOutput) {
  data::Split d = data::make_synthetic(64, 10, 3, 5);
  auto m = small_model(4);
  m->compile("sgd", "sparse_categorical_crossentropy", {"accuracy"}, true);
  std::ostringstream per_epoch, bar;
  m->fit(d.x, d.y, {.epochs = 2, .batch_size = 16, .verbose = 2, .out = &per_epoch});
  EXPECT_NE(per_epoch.str().find("Epoch 2/2"), std::string::npos) << per_epoch.str();
  EXPECT_NE(per_epoch.str().find("4/4 - "), std::string::npos) << per_epoch.str();
  EXPECT_NE(per_epoch.str().find(" - accuracy: "), std::string::npos) << per_epoch.str();
  EXPECT_EQ(per_epoch.str().find('\r'), std::string::npos);  // log files get no carriage returns
  m->fit(d.x, d.y, {.epochs = 1, .batch_size = 16, .verbose = 1, .out = &bar});
  EXPECT_NE(bar.str().find("\r4/4 [==============================]"), std::string::npos) << bar.str();
  // Not a terminal: "auto" chooses one line per epoch.
  std::ostringstream auto_out;
  m->fit(d.x, d.y, {.epochs = 1, .batch_size = 16, .out = &auto_out});
  EXPECT_EQ(auto_out.str().find('\r'), std::string::npos);
}

TEST(Sequential, MisuseIsAClearError) {
  auto m = small_model(1);
  Tensor x = Tensor::zeros({8, 10}), y = Tensor::zeros({8}, DType::i32);
  EXPECT_THROW(m->fit(x, y), InvalidArgument);  // not compiled
  m->compile("sgd", "sparse_categorical_crossentropy", {}, true);
  EXPECT_THROW(m->fit(x, Tensor::zeros({7}, DType::i32)), InvalidArgument);
  EXPECT_THROW(m->fit(x, y, {.validation_split = 1.0}), InvalidArgument);
  EXPECT_THROW(m->fit(x, y, {.batch_size = 0}), InvalidArgument);
  EXPECT_THROW(m->evaluate(x.slice(0, 0), y.slice(0, 0)), InvalidArgument);
  m->build({10});
  try {
    m->fit(Tensor::zeros({8, 11}), y, {.verbose = 0});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'dense'"), std::string::npos) << e.what();
  }
}

std::string fit_error(Sequential& m, const Tensor& x, const Tensor& y, const FitOptions& o) {
  try {
    m.fit(x, y, o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// Options that would train nothing are refused before a step, naming the option.
TEST(Sequential, OptionsThatWouldTrainNothingAreNamed) {
  auto m = small_model(1);
  m->compile("sgd", "sparse_categorical_crossentropy", {}, true);
  m->build({10});
  const Tensor x = Tensor::full({64, 10}, 0.5f), y = Tensor::zeros({64}, DType::i32);
  const auto kernel = [&] { return m->variables()[0]->value().to_vector(); };
  const std::vector<float> before = kernel();
  // 2 epochs of 4 batches: an accumulation of 9 would never reach its update.
  std::string e = fit_error(*m, x, y, {.epochs = 2, .batch_size = 16, .gradient_accumulation_steps = 9, .verbose = 0});
  EXPECT_NE(e.find("gradient_accumulation_steps 9 is more than the 8 batch(es) this fit trains (2 epoch(s) of 4)"),
            std::string::npos) << e;
  EXPECT_EQ(kernel(), before);
  e = fit_error(*m, x, y, {.batch_size = 16, .validation_split = 0.999, .verbose = 0});
  EXPECT_NE(e.find("validation_split 0.999 of 64 samples leaves no training samples"), std::string::npos) << e;
  // Exactly the fit's batches is one update.
  m->fit(x, y, {.epochs = 2, .batch_size = 16, .gradient_accumulation_steps = 8, .verbose = 0});
  EXPECT_NE(kernel(), before);
}

}  // namespace
}  // namespace dtrain
