// Input pipeline figures:
//  1. the seeds' slow-input example: a generator that sleeps 10 ms per element, 1000
//     elements, batch 32, the seeds' small model. Epoch time with no prefetch, with
//     prefetch(AUTOTUNE), and with the slow work in map(..., AUTOTUNE), against the bound
//     max(producer work / parallelism used, compute time);
//  2. throughput of from_tensor_slices -> shuffle -> batch -> prefetch over Fashion-MNIST;
//  3. that pipeline's cost per training step of the Fashion-MNIST MLP, against batches
//     already in memory (no gather at all) and against fit on the tensors with
//     shuffle=True (the same gather of shuffled rows, done in the training thread);
//  4. the floor for that gather: copying 128 random rows of the training images;
//  5. the same pipeline over the images as stored (uint8, a quarter of the bytes per
//     batch), with the model scaling them in its first layer (nn::Rescaling(1/255)),
//     against uint8 batches in memory and against float32 batches in memory;
//  6. prefetch(4) refilling for a consumer that works about half a millisecond per
//     element: how many of 40 elements the consumer waited for (a producer that overslept
//     its naps would keep it waiting; expected: at most the first few).
//  7. the record readers over Fashion-MNIST's 60,000 training images: dtrain's record
//     files (an element per record) against TFRecord files of tf.train.Example (image
//     bytes and int64 label), uncompressed and GZIP, in MB/s of file bytes; and the
//     Examples parsed in batches of 256 (parse_example) against decode_element.
//
//   bench_input_pipeline [--quick] [--fashion-mnist-only] [--prefetch-refill-only] [--record-readers-only]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

constexpr int kSlowElements = 1000;
constexpr auto kSlowWork = std::chrono::milliseconds(10);

std::unique_ptr<Sequential> seed_small_model() {
  set_random_seed(0);
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(64, "relu");
  m->add<nn::Dense>(10, "softmax");
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  m->build({100});
  return m;
}

double fit_seconds(Sequential& m, const data::Dataset& ds, double* input_wait = nullptr) {
  const double t0 = bench::now();
  History h = m.fit(ds, {.epochs = 1, .verbose = 0});
  if (input_wait) *input_wait = h.input_wait_seconds.back();
  return bench::now() - t0;
}

void slow_input(bool quick) {
  const int n = quick ? 200 : kSlowElements;
  data::Split d = data::make_synthetic(n, 100, 10, 1);
  // The element as the seeds build it: one random normal row and a label, after slow work.
  auto element = [d](std::int64_t i) {
    return data::Element{d.x.slice(i, i + 1).reshape({100}), d.y.slice(i, i + 1).reshape({})};
  };
  auto slow_generator = [=](std::int64_t i) -> std::optional<data::Element> {
    if (i >= n) return std::nullopt;
    std::this_thread::sleep_for(kSlowWork);
    return element(i);
  };
  auto fast_generator = [=](std::int64_t i) -> std::optional<data::Element> {
    if (i >= n) return std::nullopt;
    return element(i);
  };
  auto slow_map = [](const data::Element& e) {
    std::this_thread::sleep_for(kSlowWork);
    return e;
  };
  const double work = n * std::chrono::duration<double>(kSlowWork).count();

  auto m = seed_small_model();
  // Compute alone: the same batches with no input cost.
  const double compute = fit_seconds(*m, data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).cache());
  const double compute2 = fit_seconds(*m, data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).cache());

  struct Row {
    const char* name;
    data::Dataset ds;
  };
  const Row rows[] = {
      {"generator, no prefetch", data::Dataset::from_generator(slow_generator).batch(32)},
      {"generator, prefetch(AUTOTUNE)", data::Dataset::from_generator(slow_generator).batch(32).prefetch(data::AUTOTUNE)},
      {"map(slow, AUTOTUNE), prefetch(AUTOTUNE)",
       data::Dataset::from_generator(fast_generator).map(slow_map, data::AUTOTUNE).batch(32).prefetch(data::AUTOTUNE)},
      {"map(slow, 8), prefetch(AUTOTUNE), max_threads 8",
       data::Dataset::from_generator(fast_generator).map(slow_map, 8).batch(32).prefetch(data::AUTOTUNE)
           .with_options({.max_threads = 8})},
  };
  std::printf("Slow input: %d elements, %.0f ms of producer work each (%.1f s in all), batch 32, seeds' small model;"
              " compute alone %.3f s per epoch\n\n", n, work / n * 1e3, work, std::min(compute, compute2));
  std::printf("| pipeline | epoch s | input wait s | parallelism | bound s = max(work / parallelism, compute) | epoch / bound |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    double wait = 0;
    data::Iterator probe = r.ds.make_iterator(99);  // measure what AUTOTUNE picks on its own pass
    int parallelism = 1;
    for (int i = 0; i < 8 && probe.next(); ++i) {
    }
    for (const auto& line : probe.autotune_report())
      if (line.rfind("map: parallelism ", 0) == 0) parallelism = std::stoi(line.substr(17));
    const double epoch = fit_seconds(*m, r.ds, &wait);
    const bool parallel = std::string(r.name).rfind("map", 0) == 0;
    const double bound = std::max(work / (parallel ? parallelism : 1), std::min(compute, compute2));
    std::printf("| %s | %.3f | %.3f | %d | %.3f | %.2f |\n", r.name, epoch, wait, parallel ? parallelism : 1, bound,
                epoch / bound);
    std::fflush(stdout);
  }
}

void fashion_mnist(bool quick) {
  data::Classification fm = data::load_fashion_mnist();
  // The same images as stored (bytes), for the model that scales them in its first layer.
  const Tensor bytes = data::load_fashion_mnist("", DType::u8).train.x;
  const std::int64_t n = fm.train.x.dim(0);
  auto pipeline = [&](const Tensor& images) {
    return data::Dataset::from_tensor_slices({images, fm.train.y}).shuffle(n, 7).batch(128).prefetch(data::AUTOTUNE);
  };
  // The floor: gathering a batch's rows in a random order, with nothing else.
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  auto gather_us = [&](const Tensor& images, bool on_compute_pool) {
    std::vector<double> us;
    for (int r = 0; r < 5; ++r) {
      const double t0 = bench::now();
      std::int64_t batches = 0;
      for (std::int64_t b = 0; b + 128 <= n; b += 128, ++batches)
        data::gather_rows({images, fm.train.y}, std::span(order).subspan(static_cast<std::size_t>(b), 128),
                          on_compute_pool);
      us.push_back((bench::now() - t0) / static_cast<double>(batches) * 1e6);
    }
    return bench::median(us);
  };
  std::printf("\nFashion-MNIST pipeline from_tensor_slices -> shuffle(60000) -> batch(128) -> prefetch(AUTOTUNE)\n");
  set_num_threads(2);
  std::printf("gathering one batch of 128 shuffled rows (x and y), alone, median of 5 epochs: %.1f us as float32, "
              "%.1f us as uint8 on one thread; %.1f us and %.1f us split over 2 compute threads\n\n",
              gather_us(fm.train.x, false), gather_us(bytes, false), gather_us(fm.train.x, true),
              gather_us(bytes, true));
  std::printf("| threads | pipeline alone, elements/s | step ms, batches in memory | step ms, fit(x, y, shuffle) | "
              "step ms, pipeline | step ms, pipeline without prefetch | step ms, uint8 batches in memory | "
              "step ms, uint8 pipeline | overhead: fit(x, y, shuffle) | overhead: pipeline | "
              "overhead: pipeline without prefetch | overhead: uint8 pipeline | uint8 pipeline against float32 in memory |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> wait_lines;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    // 2. Iterating the pipeline with no consumer work.
    std::vector<double> rates;
    for (int r = 0; r < (quick ? 1 : 3); ++r) {
      data::Iterator it = pipeline(fm.train.x).make_iterator(static_cast<std::uint64_t>(r));
      const double t0 = bench::now();
      std::int64_t elements = 0;
      while (auto e = it.next()) elements += (*e)[0].dim(0);
      rates.push_back(static_cast<double>(elements) / (bench::now() - t0));
    }
    // 3. Steady-state step time. Medians over epochs after the first.
    auto model = [](bool rescale) {
      set_random_seed(0);
      auto m = std::make_unique<Sequential>();
      if (rescale) m->add<nn::Rescaling>(1.0f / 255);
      m->add<nn::Dense>(256, "relu");
      m->add<nn::Dense>(128, "relu");
      m->add<nn::Dense>(10);
      m->compile(std::make_shared<optim::Adam>(1e-3f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
      return m;
    };
    // The ways to train take turns, one epoch each, so that a slow spell of the machine
    // hits all of them; per round, each is set against the batches in memory (of its own
    // kind), and the medians over rounds after the first are reported. The ways of one
    // kind train one model between them: two models of the same shape can differ by a
    // percent or two in step time with where their buffers landed in memory, which is the
    // size of the difference measured here.
    const int rounds = quick ? 2 : 13;
    auto in_memory = [&](const Tensor& images) {
      return data::Dataset::from_tensor_slices({images, fm.train.y}).batch(128).cache();
    };
    // Without prefetch the batch is gathered in the training thread, on the compute threads.
    const data::Dataset inline_ds = data::Dataset::from_tensor_slices({fm.train.x, fm.train.y}).shuffle(n, 7).batch(128);
    enum { memory, tensors, piped, no_prefetch, memory_u8, piped_u8, ways };
    const data::Dataset datasets[ways] = {in_memory(fm.train.x), in_memory(fm.train.x), pipeline(fm.train.x), inline_ds,
                                          in_memory(bytes), pipeline(bytes)};
    const std::unique_ptr<Sequential> float_model = model(false), byte_model = model(true);
    auto model_of = [&](int k) -> Sequential& { return k == memory_u8 || k == piped_u8 ? *byte_model : *float_model; };
    std::vector<double> ms[ways], wait_share[ways];
    std::vector<double> ratio[5];
    const double steps = static_cast<double>(n / 128 + (n % 128 ? 1 : 0));
    for (int r = 0; r < rounds; ++r) {
      double t[ways], wait[ways];
      for (int k = 0; k < ways; ++k) {
        const int epoch = r * ways + k;  // each model's epochs count on across the ways
        const FitOptions one{.epochs = epoch + 1, .batch_size = 128, .initial_epoch = epoch, .verbose = 0};
        const History h =
            k == tensors ? model_of(k).fit(fm.train.x, fm.train.y, one) : model_of(k).fit(datasets[k], one);
        t[k] = 128e3 / h.samples_per_second.back();
        wait[k] = h.input_wait_seconds.back() * 1e3 / steps;  // ms per step
      }
      if (r == 0) continue;  // warm-up: primitive creation, first touches
      for (int k = 0; k < ways; ++k) {
        ms[k].push_back(t[k]);
        wait_share[k].push_back(wait[k] / t[k]);
      }
      ratio[0].push_back(t[tensors] / t[memory]);
      ratio[1].push_back(t[piped] / t[memory]);
      ratio[2].push_back(t[no_prefetch] / t[memory]);
      ratio[3].push_back(t[piped_u8] / t[memory_u8]);
      ratio[4].push_back(t[piped_u8] / t[memory]);
    }
    auto overhead = [&](int k) { return 100.0 * (bench::median(ratio[k]) - 1.0); };
    std::printf("| %d | %.0f |", threads, bench::median(rates));
    for (int k : {memory, tensors, piped, no_prefetch, memory_u8, piped_u8}) std::printf(" %.3f |", bench::median(ms[k]));
    for (int k = 0; k < 5; ++k) std::printf(" %+.1f%% |", overhead(k));
    std::printf("\n");
    // The training thread's wait for each batch (which includes gathering it where the
    // pipeline runs inline), as a share of the step: the pipeline's cost measured directly.
    char line[160];
    std::snprintf(line, sizeof line, "| %d | %.1f%% | %.1f%% | %.1f%% | %.1f%% |", threads,
                  100.0 * bench::median(wait_share[memory]), 100.0 * bench::median(wait_share[piped]),
                  100.0 * bench::median(wait_share[memory_u8]), 100.0 * bench::median(wait_share[piped_u8]));
    wait_lines.push_back(line);
    std::fflush(stdout);
  }
  std::printf("\nInput wait per step, as a share of the step (median over rounds)\n\n"
              "| threads | batches in memory | pipeline | uint8 batches in memory | uint8 pipeline |\n|---|---|---|---|---|\n");
  for (const std::string& line : wait_lines) std::printf("%s\n", line.c_str());
}

// CPU work, about a hundred microseconds of it.
void busy() {
  volatile double acc = 0;
  for (int i = 0; i < 40000; ++i) acc = acc + std::sqrt(static_cast<double>(i));
}

void prefetch_refill() {
  set_num_threads(1);  // a core for the producer where there are two
  std::printf("\nprefetch(4), a consumer working ~0.5 ms per element, 40 elements, 5 runs:\n");
  for (int run = 0; run < 5; ++run) {
    data::Iterator it = data::Dataset::range(40).prefetch(4).make_iterator();
    while (it.next())
      for (int k = 0; k < 5; ++k) busy();
    std::printf("  %s\n", it.autotune_report().back().c_str());
  }
  set_num_threads(0);
}

void record_readers(bool quick) {
  const data::Classification fm = data::load_fashion_mnist("", DType::u8);
  const std::int64_t n = quick ? 10000 : fm.train.x.dim(0), pixels = fm.train.x.numel() / fm.train.x.dim(0);
  const std::string dir = "/tmp/dtrain_bench_records_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string records = dir + "/train.rec", plain = dir + "/train.tfrecord", gz = dir + "/train.tfrecord.gz";
  {
    data::RecordWriter r(records);
    data::RecordWriter t(plain, data::RecordFraming::tfrecord);
    data::RecordWriter g(gz, data::RecordFraming::tfrecord, data::Compression::gzip);
    for (std::int64_t i = 0; i < n; ++i) {
      const Tensor image = fm.train.x.slice(i, i + 1).reshape(Shape{pixels});
      const std::int32_t label = fm.train.y.data<std::int32_t>()[i];
      r.write(data::encode_element({image, Tensor::from_vector(Shape{}, std::span<const std::int32_t>(&label, 1))}));
      data::Features f;
      f["image"] = {.kind = data::Feature::Kind::bytes,
                    .bytes = {std::string(static_cast<const char*>(image.raw_data()), static_cast<std::size_t>(pixels))}};
      f["label"] = {.kind = data::Feature::Kind::int64s, .int64s = {label}};
      const std::string example = data::serialize_example(f);
      t.write(example);
      g.write(example);
    }
  }
  const std::vector<data::FeatureSpec> spec{{.key = "image", .dtype = DType::string, .shape = Shape{}},
                                            {.key = "label", .dtype = DType::i32, .shape = Shape{}}};
  struct Case {
    const char* name;
    std::string file;
    data::Dataset ds;
  };
  const std::vector<Case> cases{
      {"records (dtrain's)", records, data::Dataset::records({records})},
      {"tfrecord", plain, data::Dataset::tfrecord({plain})},
      {"tfrecord GZIP", gz, data::Dataset::tfrecord({gz}, data::Compression::gzip)},
      {"records + decode_element", records,
       data::Dataset::records({records}).map([](const data::Element& e) { return data::decode_element(e[0]); })},
      {"tfrecord + parse_example/256", plain,
       data::Dataset::tfrecord({plain}).batch(256).map([spec](const data::Element& e) {
         const auto parsed = data::parse_examples(e[0], spec);
         return data::Element{data::decode_raw(parsed[0].values, DType::u8), parsed[1].values};
       })},
  };
  std::printf("\nrecord readers, Fashion-MNIST's %lld training images, one pass each, median of 5:\n",
              static_cast<long long>(n));
  for (const Case& c : cases) {
    std::vector<double> times;
    for (int run = 0; run < 5; ++run) {
      const double start = bench::now();
      std::int64_t count = 0;
      for (data::Iterator it = c.ds.make_iterator(); it.next();) ++count;
      times.push_back(bench::now() - start);
    }
    std::sort(times.begin(), times.end());
    const double t = times[2];
    const double mb = static_cast<double>(std::filesystem::file_size(c.file)) / 1e6;
    std::printf("  %-30s %8.1f ms  %8.1f MB/s of the file (%.1f MB)  %6.2f M records/s\n", c.name, t * 1e3, mb / t, mb,
                static_cast<double>(n) / t / 1e6);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  if (bench::has_flag(argc, argv, "--record-readers-only")) {
    record_readers(quick);
    return 0;
  }
  if (bench::has_flag(argc, argv, "--prefetch-refill-only")) {
    prefetch_refill();
    return 0;
  }
  if (!bench::has_flag(argc, argv, "--fashion-mnist-only")) slow_input(quick);
  fashion_mnist(quick);
  prefetch_refill();
  return 0;
}
