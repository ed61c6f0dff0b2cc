// Dataset sources, transformations, background stages, errors and saved positions.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>
#include <set>
#include <thread>

#include "common/error_message.h"
#include "common/stage_clocks.h"
#include "common/temp_dir.h"
#include "dtrain/core/threads.h"
#include "dtrain/data/dataset.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

// The first component of every element, as integers.
std::vector<int> values(const Dataset& ds, std::uint64_t iteration = 0) {
  std::vector<int> out;
  Iterator it = ds.make_iterator(iteration);
  while (auto e = it.next())
    for (float v : (*e)[0].to_vector()) out.push_back(static_cast<int>(v));
  return out;
}

std::vector<int> iota(int n, int start = 0) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::string message_of(const std::function<void()>& f) { return testing::message_of<std::exception>(f); }

TEST(Dataset, TensorSlicesAreViewsOfRows) {
  Tensor x = Tensor::from_vector({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor y = Tensor::from_vector({3}, std::vector<std::int32_t>{7, 8, 9});
  Dataset ds = Dataset::from_tensor_slices({x, y});
  EXPECT_EQ(ds.cardinality(), 3);
  Iterator it = ds.make_iterator();
  auto e = it.next();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)[0].shape(), Shape({2}));
  EXPECT_EQ((*e)[1].shape(), Shape({}));
  EXPECT_TRUE((*e)[0].shares_storage_with(x));
  EXPECT_EQ(values(ds), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(Dataset::from_tensor_slices({x, Tensor::zeros({2})}), InvalidArgument);
}

TEST(Dataset, RangeTakeSkipRepeatFilter) {
  EXPECT_EQ(values(Dataset::range(5)), iota(5));
  EXPECT_EQ(values(Dataset::range(10, 0, -3)), (std::vector<int>{10, 7, 4, 1}));
  EXPECT_EQ(Dataset::range(10, 0, -3).cardinality(), 4);
  EXPECT_EQ(values(Dataset::range(10).skip(3).take(4)), (std::vector<int>{3, 4, 5, 6}));
  EXPECT_EQ(values(Dataset::range(3).repeat(2)), (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(values(Dataset::range(3).repeat().take(7)), (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(Dataset::range(3).repeat().cardinality(), kInfiniteCardinality);
  EXPECT_EQ(values(Dataset::range(0).repeat()), std::vector<int>{});  // ends instead of spinning
  EXPECT_EQ(values(Dataset::range(10).filter([](const Element& e) { return e[0].item() > 6; })),
            (std::vector<int>{7, 8, 9}));
}

TEST(Dataset, BatchAndUnbatch) {
  Dataset ds = Dataset::range(7).batch(3);
  EXPECT_EQ(ds.cardinality(), 3);
  Iterator it = ds.make_iterator();
  EXPECT_EQ(it.next()->at(0).shape(), Shape({3}));
  it.next();
  EXPECT_EQ(it.next()->at(0).shape(), Shape({1}));  // the short last batch
  EXPECT_FALSE(it.next());
  EXPECT_EQ(values(Dataset::range(7).batch(3, /*drop_remainder=*/true)), iota(6));
  EXPECT_EQ(values(Dataset::range(7).batch(3).unbatch()), iota(7));
  EXPECT_THROW(Dataset::range(7).batch(0), InvalidArgument);
}

TEST(Dataset, BatchingMismatchedShapesNamesTheElement) {
  Dataset ds = Dataset::from_generator([](std::int64_t i) -> std::optional<Element> {
    if (i >= 3) return std::nullopt;
    return Element{Tensor::zeros({i == 2 ? 4 : 3})};
  });
  const std::string m = message_of([&] { values(ds.batch(3)); });
  EXPECT_NE(m.find("element 2"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
}

TEST(Dataset, ShardSplitsAndChecksIndex) {
  EXPECT_EQ(values(Dataset::range(10).shard(3, 1)), (std::vector<int>{1, 4, 7}));
  EXPECT_EQ(Dataset::range(10).shard(3, 0).cardinality(), 4);
  const std::string m = message_of([] { Dataset::range(10).shard(3, 3); });
  EXPECT_NE(m.find("index 3"), std::string::npos) << m;
  EXPECT_NE(m.find("3 shards"), std::string::npos) << m;
}

TEST(Dataset, ShuffleIsASeededPermutationPerPass) {
  Dataset ds = Dataset::range(100).shuffle(30, /*seed=*/5);
  const auto a = values(ds, 0), b = values(ds, 0), c = values(ds, 1);
  EXPECT_EQ(a, b);  // same seed, same pass: same order
  EXPECT_NE(a, c);  // reshuffled for the next pass
  EXPECT_NE(a, iota(100));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(100));
  Dataset fixed = Dataset::range(100).shuffle(30, 5, /*reshuffle_each_iteration=*/false);
  EXPECT_EQ(values(fixed, 0), values(fixed, 1));
  EXPECT_NE(values(Dataset::range(100).shuffle(30, 6)), a);
  EXPECT_THROW(Dataset::range(3).shuffle(0), InvalidArgument);
}

// Shuffle and batch over tensor slices draw row numbers and gather rows; the order and the
// batches must be exactly those of the element-by-element stages (reached here through an
// identity map, which hides the rows from shuffle).
TEST(Dataset, ShuffledSlicesGatherTheSameBatchesAsElements) {
  std::vector<float> xv(97 * 3);
  std::iota(xv.begin(), xv.end(), 0.0f);
  std::vector<std::int32_t> yv(97);
  std::iota(yv.begin(), yv.end(), 1000);
  const Tensor x = Tensor::from_vector({97, 3}, xv), y = Tensor::from_vector({97}, yv);
  auto identity = [](const Element& e) { return e; };
  const Dataset rows = Dataset::from_tensor_slices({x, y});
  const Dataset elements = rows.map(identity);
  for (std::int64_t buffer : {1, 10, 97, 500})
    for (bool drop : {false, true}) {
      const Dataset fast = rows.shuffle(buffer, 4).batch(8, drop), slow = elements.shuffle(buffer, 4).batch(8, drop);
      for (std::uint64_t pass : {0u, 1u}) {
        Iterator a = fast.make_iterator(pass), b = slow.make_iterator(pass);
        int batches = 0;
        for (;; ++batches) {
          auto ea = a.next(), eb = b.next();
          ASSERT_EQ(ea.has_value(), eb.has_value()) << "buffer " << buffer << ", batch " << batches;
          if (!ea) break;
          EXPECT_EQ((*ea)[0].shape(), (*eb)[0].shape());
          EXPECT_EQ((*ea)[0].to_vector(), (*eb)[0].to_vector()) << "buffer " << buffer << ", batch " << batches;
          EXPECT_EQ((*ea)[1].to_vector(), (*eb)[1].to_vector());
        }
        EXPECT_EQ(batches, drop ? 12 : 13);
      }
      EXPECT_EQ(values(rows.shuffle(buffer, 4)), values(elements.shuffle(buffer, 4)));
    }
  // Unshuffled batches of slices are views of the tensors; cache() of slices reads them too.
  Iterator it = rows.cache().batch(8).make_iterator();
  auto first = it.next();
  ASSERT_TRUE(first);
  EXPECT_TRUE((*first)[0].shares_storage_with(x));
  EXPECT_EQ((*first)[1].to_vector(), (std::vector<float>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007}));
}

// Rows of 16 KB: a batch gathered in the consumer's thread is split over the compute
// threads, one gathered below a prefetch is copied by the producer alone; both must hold
// the same rows as batches stacked from elements.
TEST(Dataset, GatheredBatchesAreTheSameOnAnyThread) {
  set_num_threads(2);
  std::vector<float> xv(256 * 4096);
  std::iota(xv.begin(), xv.end(), 0.0f);
  const Dataset rows = Dataset::from_tensor_slices({Tensor::from_vector({256, 4096}, xv)});
  const Dataset shuffled = rows.shuffle(256, 3).batch(32);
  const auto expected = values(rows.map([](const Element& e) { return e; }).shuffle(256, 3).batch(32));
  EXPECT_EQ(values(shuffled), expected);
  EXPECT_EQ(values(shuffled.prefetch(2)), expected);
  std::vector<std::int64_t> order(256);
  std::iota(order.rbegin(), order.rend(), 0);
  const Tensor x = Tensor::from_vector({256, 4096}, xv);
  EXPECT_EQ(gather_rows({x}, order, /*on_compute_pool=*/true)[0].to_vector(), gather_rows({x}, order)[0].to_vector());
  set_num_threads(0);
}

TEST(Dataset, RowStatesAreCheckedOnRestore) {
  const Dataset ds = Dataset::from_tensor_slices({Tensor::from_vector({6}, iota(6))}).shuffle(4, 1);
  Iterator it = ds.make_iterator();
  it.next();
  IteratorState s = it.save();  // counter, next row, buffer length, buffered rows, seed
  ASSERT_EQ(s.values.size(), 3u + 3u + 1u);  // four filled, one drawn
  s.values[4] = s.values[3];     // the same row twice
  Iterator again = ds.make_iterator();
  EXPECT_THROW(again.restore(s), InvalidArgument);
  Iterator slices = Dataset::from_tensor_slices({Tensor::from_vector({6}, iota(6))}).make_iterator();
  EXPECT_THROW(slices.restore(IteratorState{{7}, {}, {}}), InvalidArgument);  // past the end
  // No rows at all: every stage ends at once.
  const Dataset empty = Dataset::from_tensor_slices({Tensor::zeros({0, 3})});
  EXPECT_FALSE(empty.shuffle(10, 1).batch(4).make_iterator().next());
  EXPECT_FALSE(empty.batch(4, true).make_iterator().next());
  EXPECT_FALSE(empty.shuffle(10, 1).make_iterator().next());
}

// A shuffle saved in one pass (epoch) resumes that pass's order when restored into an
// iterator of another pass, whichever shuffle (of elements, or of tensor slices' rows);
// a state saved without the seed takes the restoring iterator's.
TEST(Dataset, AShuffleRestoredInAnotherPassResumesTheSavedPass) {
  const Dataset by_rows = Dataset::from_tensor_slices({Tensor::from_vector({20}, iota(20))}).shuffle(8, 5);
  const Dataset by_elements = Dataset::range(20).shuffle(8, 5);
  for (const Dataset* ds : {&by_rows, &by_elements}) {
    Iterator pass2 = ds->make_iterator(2);
    for (int i = 0; i < 5; ++i) pass2.next();
    const IteratorState saved = pass2.save();
    std::vector<float> rest, resumed;
    while (auto e = pass2.next()) rest.push_back((*e)[0].astype(DType::f32).item());
    Iterator pass7 = ds->make_iterator(7);
    pass7.restore(saved);
    while (auto e = pass7.next()) resumed.push_back((*e)[0].astype(DType::f32).item());
    EXPECT_EQ(resumed, rest) << (ds == &by_rows ? "rows" : "elements");
    // Passes differ in order: the seed is what made the resumed one the saved pass's.
    EXPECT_NE(values(*ds, 2), values(*ds, 7));
  }
}

TEST(Dataset, GatherRowsChecksEveryRow) {
  const Tensor x = Tensor::from_vector({3, 2}, {0, 1, 2, 3, 4, 5});
  const std::vector<std::int64_t> rows{2, 0};
  EXPECT_EQ(gather_rows({x}, rows)[0].to_vector(), (std::vector<float>{4, 5, 0, 1}));
  const std::vector<std::int64_t> bad{1, 3};
  EXPECT_NE(message_of([&] { gather_rows({x}, bad); }).find("row 3 is out of range for tensor 0 of shape [3, 2]"),
            std::string::npos);
}

TEST(Dataset, CacheReadsTheSourceOnce) {
  std::atomic<int> calls{0};
  Dataset ds = Dataset::from_generator([&](std::int64_t i) -> std::optional<Element> {
                 ++calls;
                 if (i >= 5) return std::nullopt;
                 return Element{Tensor::scalar(static_cast<float>(i))};
               }).cache();
  EXPECT_EQ(values(ds), iota(5));
  EXPECT_EQ(values(ds, 1), iota(5));
  EXPECT_EQ(values(ds.repeat(3)), (std::vector<int>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(calls.load(), 6);  // one pass: 5 elements and the end
}

TEST(Dataset, ParallelMapKeepsOrderWhenDeterministic) {
  auto square = [](const Element& e) {
    const float v = e[0].item();
    return Element{Tensor::scalar(v * v)};
  };
  std::vector<int> want;
  for (int i = 0; i < 200; ++i) want.push_back(i * i);
  EXPECT_EQ(values(Dataset::range(200).map(square)), want);
  EXPECT_EQ(values(Dataset::range(200).map(square, 4)), want);
  EXPECT_EQ(values(Dataset::range(200).map(square, AUTOTUNE)), want);
  auto any_order = values(Dataset::range(200).map(square, 4, /*deterministic=*/false));
  std::sort(any_order.begin(), any_order.end());
  EXPECT_EQ(any_order, want);
}

TEST(Dataset, ShuffledParallelPipelineIsReproducible) {
  auto pipeline = [] {
    return Dataset::range(300)
        .shuffle(50, 11)
        .map([](const Element& e) { return Element{Tensor::scalar(e[0].item() + 1)}; }, AUTOTUNE)
        .batch(8)
        .prefetch(AUTOTUNE);
  };
  EXPECT_EQ(values(pipeline()), values(pipeline()));
}

TEST(Dataset, GeneratorErrorReachesTheConsumerWithItsIndex) {
  Dataset ds = Dataset::from_generator([](std::int64_t i) -> std::optional<Element> {
    if (i == 17) throw IoError("disk on fire");
    return Element{Tensor::scalar(static_cast<float>(i))};
  });
  for (const Dataset& d : {ds, ds.prefetch(2), ds.map([](const Element& e) { return e; }, 3)}) {
    Iterator it = d.make_iterator();
    for (int i = 0; i < 17; ++i) ASSERT_TRUE(it.next());
    try {
      it.next();
      FAIL() << "expected an error";
    } catch (const IoError& e) {  // the kind of error is kept
      EXPECT_NE(std::string(e.what()).find("element 17"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos) << e.what();
    }
  }
}

TEST(Dataset, MapErrorNamesTheElement) {
  auto fn = [](const Element& e) -> Element {
    if (e[0].item() == 5) throw InvalidArgument("bad value");
    return e;
  };
  for (std::int64_t p : {std::int64_t{0}, std::int64_t{3}}) {
    const std::string m = message_of([&] { values(Dataset::range(10).map(fn, p)); });
    EXPECT_NE(m.find("map: element 5: bad value"), std::string::npos) << m;
  }
}

TEST(Dataset, InputWaitIsRecordedPerElement) {
  // A synchronous pipeline: the consumer waits at least as long as the generator works.
  Dataset ds = Dataset::from_generator([](std::int64_t i) -> std::optional<Element> {
    if (i >= 5) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Element{Tensor::scalar(0)};
  });
  Iterator it = ds.make_iterator();
  while (it.next()) {
  }
  EXPECT_EQ(it.stats().elements, 5);
  EXPECT_GE(it.stats().wait_seconds, 5 * 0.002);
  EXPECT_GE(it.stats().max_wait_seconds, 0.002);
  EXPECT_LE(it.stats().last_wait_seconds, it.stats().max_wait_seconds);
}

TEST(Dataset, DestroyingMidEpochStopsBackgroundThreads) {
  std::atomic<std::int64_t> produced{0};
  auto slow = [&](std::int64_t i) -> std::optional<Element> {
    produced = i;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return Element{Tensor::scalar(static_cast<float>(i))};  // infinite
  };
  for (int round = 0; round < 5; ++round) {
    Dataset ds = Dataset::from_generator(slow).map([](const Element& e) { return e; }, AUTOTUNE).prefetch(AUTOTUNE).prefetch(4);
    Iterator it = ds.make_iterator();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(it.next());
  }  // each iterator is destroyed with threads blocked in waits and in the generator
  const std::int64_t after = produced.load();
  EXPECT_GT(after, 0);
}

TEST(Dataset, StoppingMidPassNeverTruncatesACache) {
  // Background stages below and above the cache: destroying the iterator mid-pass stops
  // them, and the cache must not take that for the end of the data.
  auto work = [](const Element& e) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // simulated per-element work
    return e;
  };
  for (int round = 0; round < 5; ++round) {
    Dataset cached = Dataset::range(40).map(work, 2).cache();
    {
      Iterator it = cached.prefetch(2).make_iterator();
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(it.next());
    }
    EXPECT_EQ(values(cached), iota(40)) << "round " << round;
  }
}

TEST(Dataset, CacheStateRestoresIntoAnEmptyCache) {
  // Saved while reading a complete cache; restored where the cache is empty (a new process).
  auto make = [] { return Dataset::range(20).cache(); };
  Dataset first = make();
  values(first);  // fills the cache
  Iterator it = first.make_iterator(1);
  for (int i = 0; i < 7; ++i) it.next();
  const IteratorState state = it.save();
  Dataset fresh = make();
  Iterator resumed = fresh.make_iterator(1);
  resumed.restore(state);
  std::vector<int> rest;
  while (auto e = resumed.next()) rest.push_back(static_cast<int>((*e)[0].item()));
  EXPECT_EQ(rest, iota(13, 7));
}

TEST(Dataset, FailedRestoreLeavesAUsableIterator) {
  Iterator it = Dataset::range(5).shuffle(3, 1).make_iterator();
  EXPECT_THROW(it.restore(IteratorState{{1}, {}, {}}), InvalidArgument);
  int n = 0;
  while (it.next()) ++n;
  EXPECT_EQ(n, 5);
}

TEST(Dataset, AutotuneReportsWhatItChose) {
  Dataset ds = Dataset::range(200).map([](const Element& e) { return e; }, AUTOTUNE).prefetch(AUTOTUNE);
  Iterator it = ds.make_iterator();
  while (it.next()) {
  }
  const auto lines = it.autotune_report();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("map: parallelism"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("prefetch: buffer"), std::string::npos) << lines[1];
}

// CPU work, about a hundred microseconds of it.
Element busy(const Element& e) {
  volatile double acc = 0;
  for (int i = 0; i < 40000; ++i) acc = acc + std::sqrt(static_cast<double>(i));
  return e;
}

// A full buffer makes the producer nap until half of it has been taken; the consumer wakes
// it only when what is left would run out first. Whichever side is faster, and whatever
// the buffer, every element arrives once and in order; the report states the refill size
// (half the buffer) and counts the elements consumed. How many of them the consumer
// waited for, and whether a fast producer refills in time, is a matter of timing:
// bench_input_pipeline --prefetch-refill-only shows it.
TEST(Dataset, PrefetchDeliversEveryElementInOrderWhicheverSideIsFaster) {
  set_num_threads(1);  // a core for the producer where there are two
  auto slow_side = [](int k) {
    for (int i = 0; i < k; ++i) busy(Element{});
  };
  for (const std::int64_t buffer : {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, std::int64_t{8}, AUTOTUNE})
    for (const bool slow_consumer : {true, false}) {
      const Dataset ds = Dataset::range(60)
                             .map([slow_consumer, slow_side](const Element& e) {
                               if (!slow_consumer) slow_side(1);
                               return e;
                             })
                             .prefetch(buffer);
      Iterator it = ds.make_iterator();
      std::vector<int> got;
      while (auto e = it.next()) {
        got.push_back(static_cast<int>((*e)[0].item()));
        if (slow_consumer) slow_side(1);
      }
      EXPECT_EQ(got, iota(60)) << "buffer " << buffer << (slow_consumer ? ", slow consumer" : ", slow producer");
      if (buffer == 8) {
        EXPECT_NE(it.autotune_report().back().find("refilled 4 at a time"), std::string::npos)
            << it.autotune_report().back();
      }
    }
  {
    Iterator it = Dataset::range(40).prefetch(4).make_iterator();
    int n = 0;
    while (it.next()) {
      ++n;
      slow_side(5);  // half a millisecond or so per element
    }
    EXPECT_EQ(n, 40);
    const std::string report = it.autotune_report().back();
    EXPECT_NE(report.find("refilled 2 at a time"), std::string::npos) << report;
    EXPECT_NE(report.find(" of 40 elements"), std::string::npos) << report;
  }
  set_num_threads(0);
}

using testing::producer_clocks;
using testing::run_under;
using testing::went_inline;

// With every core computing for the consumer, a producer that computes would only take
// its time from a compute thread: AUTOTUNE pulls in the consumer's thread instead. A
// producer that waits (I/O), or one with a core of its own, keeps its thread.
TEST(Dataset, AutotunePrefetchPullsInlineOnlyWhenNoCoreIsIdle) {
  auto identity = [](const Element& e) { return e; };
  set_num_threads(available_cores());
  {
    auto it = run_under(Dataset::range(100).map(identity).prefetch(AUTOTUNE), producer_clocks(true));
    std::vector<int> got;
    while (auto e = it->next()) got.push_back(static_cast<int>((*e)[0].item()));
    EXPECT_EQ(got, iota(100));
    EXPECT_TRUE(went_inline(*it));
  }
  {
    // An input error after the switch is kept, as in a background stage: not skipped.
    auto failing = [](const Element& e) {
      if (e[0].item() == 50.0f) throw IoError("element 50 is unreadable");
      return e;
    };
    auto it = run_under(Dataset::range(100).map(failing).prefetch(AUTOTUNE), producer_clocks(true));
    int n = 0;
    EXPECT_THROW(while (it->next()) ++n, Error);
    EXPECT_EQ(n, 50);
    EXPECT_THROW(it->next(), Error);
    EXPECT_THROW(it->save(), InvalidArgument);
    EXPECT_TRUE(went_inline(*it));
  }
  {
    auto it = run_under(Dataset::range(20).map(identity).prefetch(AUTOTUNE), producer_clocks(false));
    int n = 0;
    while (it->next()) ++n;
    EXPECT_EQ(n, 20);
    EXPECT_FALSE(went_inline(*it));
  }
  if (available_cores() > 1) {
    set_num_threads(available_cores() - 1);
    auto it = run_under(Dataset::range(100).map(identity).prefetch(AUTOTUNE), producer_clocks(true));
    while (it->next()) {
    }
    EXPECT_FALSE(went_inline(*it));
  }
  set_num_threads(0);
}

// A map function or source that never returns holds a background stage's element; save()
// gives up after the pipeline's timeout, naming the stage, and works again once it returned.
// next() waits for an element without limit unless element_timeout_seconds says otherwise.
TEST(Dataset, WaitsForAStuckBackgroundStageAreBounded) {
  DatasetOptions options;
  options.timeout_seconds = 0.1;
  options.element_timeout_seconds = 0.1;
  auto stuck_at = [](std::int64_t at, std::shared_future<void> release, std::shared_ptr<std::promise<void>> entered) {
    return [at, release, entered](const Element& e) {
      if (e[0].item() == static_cast<float>(at)) {
        entered->set_value();
        release.wait();
      }
      return e;
    };
  };
  for (const bool parallel : {true, false}) {
    std::promise<void> release;
    auto entered = std::make_shared<std::promise<void>>();
    std::future<void> inside = entered->get_future();
    auto fn = stuck_at(2, release.get_future().share(), entered);
    // Parallel: the map's own workers call fn; otherwise the prefetch's producer does.
    const Dataset ds = (parallel ? Dataset::range(6).map(fn, 2) : Dataset::range(6).map(fn).prefetch(2)).with_options(options);
    const char* stage = parallel ? "map: " : "prefetch: ";
    Iterator it = ds.make_iterator();
    EXPECT_EQ((*it.next())[0].item(), 0.0f);
    EXPECT_EQ((*it.next())[0].item(), 1.0f);
    inside.wait();  // fn is inside element 2
    const std::string saved = message_of([&] { it.save(); });
    EXPECT_NE(saved.find(std::string(stage) + "save() waited 0.1 s for"), std::string::npos) << saved;
    EXPECT_NE(saved.find("timeout_seconds sets the limit"), std::string::npos) << saved;
    const std::string next = message_of([&] { it.next(); });
    EXPECT_NE(next.find(std::string(stage) + "next() waited 0.1 s for"), std::string::npos) << next;
    release.set_value();
    std::vector<int> rest;
    while (auto e = it.next()) rest.push_back(static_cast<int>((*e)[0].item()));
    EXPECT_EQ(rest, iota(4, 2)) << stage;
  }
}

// Consume k elements, save, restore into a new iterator: the rest equals an uninterrupted run.
void expect_resumes_exactly(const Dataset& ds, int k) {
  std::vector<int> full = values(ds, 3);
  Iterator first = ds.make_iterator(3);
  std::vector<int> seen;
  for (int i = 0; i < k; ++i) {
    auto e = first.next();
    if (!e) break;
    for (float v : (*e)[0].to_vector()) seen.push_back(static_cast<int>(v));
  }
  const std::string bytes = first.save().to_bytes();
  Iterator second = ds.make_iterator(3);
  second.restore(IteratorState::from_bytes(bytes));
  while (auto e = second.next())
    for (float v : (*e)[0].to_vector()) seen.push_back(static_cast<int>(v));
  EXPECT_EQ(seen, full) << "after " << k << " elements";
}

TEST(Dataset, SavedPositionResumesExactly) {
  auto plus_one = [](const Element& e) { return Element{Tensor::scalar(e[0].item() + 1)}; };
  const Dataset pipelines[] = {
      Dataset::range(50),
      Dataset::range(50).shuffle(16, 3).batch(4),
      Dataset::from_tensor_slices({Tensor::from_vector({50}, iota(50))}).shuffle(16, 3).batch(4),
      Dataset::from_tensor_slices({Tensor::from_vector({50}, iota(50))}).shuffle(16, 3),
      Dataset::range(40).shuffle(8, 1).repeat(2).shard(3, 1),
      Dataset::range(60).map(plus_one, 3).batch(5).prefetch(3),
      Dataset::range(60).shuffle(20, 9).map(plus_one, AUTOTUNE).batch(7).prefetch(AUTOTUNE),
      Dataset::range(30).batch(4).unbatch().skip(2).take(20),
      Dataset::range(25).filter([](const Element& e) { return static_cast<int>(e[0].item()) % 3 != 0; }).cache(),
  };
  for (const Dataset& ds : pipelines)
    for (int k : {0, 1, 5, 13}) expect_resumes_exactly(ds, k);
}

TEST(Dataset, StateFromOtherBytesIsAnError) {
  EXPECT_THROW(IteratorState::from_bytes("nonsense"), IoError);
  Iterator it = Dataset::range(3).make_iterator();
  EXPECT_THROW(it.restore(IteratorState{}), InvalidArgument);
}

using Files = testing::TempDirTest;

TEST_F(Files, CsvColumnsLabelsAndErrors) {
  const std::string f = write("a.csv", "x,y,label\n1,2,0\n3.5, 4 ,1\n\n5,6,1\n");
  Iterator it = Dataset::csv({f}, {.label_column = "label"}).make_iterator();
  auto e = it.next();
  EXPECT_EQ((*e)[0].to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ((*e)[1].item(), 0.0f);
  EXPECT_EQ(it.next()->at(0).to_vector(), (std::vector<float>{3.5f, 4}));
  EXPECT_TRUE(it.next());
  EXPECT_FALSE(it.next());
  EXPECT_EQ(values(Dataset::csv({f}, {.select_columns = {"y"}})), (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(values(Dataset::csv({write("n.csv", "1,2\n3,4\n")}, {.header = false, .select_columns = {"1"}})),
            (std::vector<int>{2, 4}));

  const std::string bad = write("bad.csv", "a,b\n1,2\n3,oops\n");
  std::string m = message_of([&] { values(Dataset::csv({bad})); });
  EXPECT_NE(m.find(bad + ":3"), std::string::npos) << m;
  EXPECT_NE(m.find("'oops' is not a number"), std::string::npos) << m;
  const std::string ragged = write("ragged.csv", "a,b\n1,2\n3\n");
  m = message_of([&] { values(Dataset::csv({ragged})); });
  EXPECT_NE(m.find(ragged + ":3"), std::string::npos) << m;
  m = message_of([&] { values(Dataset::csv({f}, {.select_columns = {"z"}})); });
  EXPECT_NE(m.find("no column 'z'"), std::string::npos) << m;
  expect_resumes_exactly(Dataset::csv({f, write("b.csv", "x,y,label\n7,8,0\n")}), 2);
}

// Every string of every element, in order (elements of one string tensor each).
std::vector<std::string> strings_of(Iterator& it, std::int64_t limit = -1) {
  std::vector<std::string> out;
  for (std::int64_t n = 0; n != limit; ++n) {
    auto e = it.next();
    if (!e) break;
    const Tensor& t = (*e)[0];
    out.insert(out.end(), t.data<std::string>(), t.data<std::string>() + t.numel());
  }
  return out;
}

std::vector<std::string> strings_of(const Dataset& ds) {
  Iterator it = ds.make_iterator();
  return strings_of(it);
}

std::string gzipped(const fs::path& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  return path.string();
}

TEST_F(Files, TextLinesAreEveryLineWithoutItsEndAcrossFilesAndResume) {
  const std::string longest(100000, 'x');  // longer than the reader's buffer
  const std::string a = write("a.txt", std::string("one\r\n\ntwo\0three\n", 16) + longest + "\nno newline at the end");
  const std::string b = gzipped(dir_ / "b.txt.gz", "four\nfive\n");
  const std::vector<std::string> want{"one", "", std::string("two\0three", 9), longest, "no newline at the end", "four",
                                      "five"};
  const Dataset plain = Dataset::text_lines({a, (dir_ / "b.txt").string()});
  (void)write("b.txt", "four\nfive\n");
  EXPECT_EQ(strings_of(plain), want);
  const Dataset mixed = Dataset::text_lines({a, b});  // zlib reads a file that is not compressed as it is
  EXPECT_EQ(strings_of(mixed), want);
  EXPECT_EQ(strings_of(Dataset::text_lines({b}, "GZIP")), (std::vector<std::string>{"four", "five"}));
  EXPECT_EQ(mixed.input_files(), 2);
  // Saved after each element, a new iterator restored there goes on with the next.
  for (std::int64_t k : {0, 1, 4, 6, 7}) {
    Iterator first = mixed.make_iterator();
    std::vector<std::string> seen = strings_of(first, k);
    Iterator second = mixed.make_iterator();
    second.restore(IteratorState::from_bytes(first.save().to_bytes()));
    for (std::string& line : strings_of(second)) seen.push_back(std::move(line));
    EXPECT_EQ(seen, want) << "saved after " << k;
  }
}

TEST_F(Files, TextLinesNameTheFileThatCannotBeRead) {
  const std::string missing = (dir_ / "missing.txt").string();
  std::string m = testing::message_of<IoError>([&] { strings_of(Dataset::text_lines({missing})); });
  EXPECT_NE(m.find(missing + ": cannot open"), std::string::npos) << m;
  const std::string plain = write("plain.txt", "a\nb\n");
  m = testing::message_of<IoError>([&] { strings_of(Dataset::text_lines({plain}, "GZIP")); });
  EXPECT_NE(m.find(plain + ": compression_type is 'GZIP' but the file is not gzip-compressed"), std::string::npos) << m;
  // A compressed file cut short: the lines before the cut come, then an error naming it.
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + "\n";
  std::string bytes;
  {
    std::ifstream in(gzipped(dir_ / "whole.gz", text), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = write("cut.gz", bytes.substr(0, bytes.size() / 2));
  Iterator it = Dataset::text_lines({cut}, "GZIP").make_iterator();
  m = testing::message_of<IoError>([&] { strings_of(it); });
  EXPECT_NE(m.find(cut + ": the compressed data ends early, in line "), std::string::npos) << m;
  m = testing::message_of<InvalidArgument>([&] { Dataset::text_lines({plain}, "ZLIB"); });
  EXPECT_NE(m.find("compression_type 'ZLIB'"), std::string::npos) << m;
}

TEST(Dataset, StringsGoThroughBatchShuffleCacheAndSavedPositions) {
  std::vector<std::string> words;
  for (int i = 0; i < 23; ++i) words.push_back("word " + std::to_string(i) + std::string(static_cast<std::size_t>(i), '!'));
  const Tensor labels = Tensor::from_vector({23}, std::vector<std::int32_t>(23, 7));
  const Dataset ds =
      Dataset::from_tensor_slices({Tensor::from_vector({23}, words), labels}).cache().shuffle(8, 5).batch(4);
  Iterator it = ds.make_iterator();
  auto first = it.next();
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)[0].dtype(), DType::string);
  EXPECT_EQ((*first)[0].shape(), Shape({4}));
  std::vector<std::string> all = strings_of(ds);
  std::vector<std::string> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> want = words;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(sorted, want);
  EXPECT_NE(all, words);  // shuffled
  for (std::int64_t k : {1, 3}) {
    Iterator a = ds.make_iterator();
    std::vector<std::string> seen = strings_of(a, k);
    Iterator b = ds.make_iterator();
    b.restore(IteratorState::from_bytes(a.save().to_bytes()));  // the shuffle buffer holds strings
    for (std::string& w : strings_of(b)) seen.push_back(std::move(w));
    EXPECT_EQ(seen, all) << "saved after " << k;
  }
  EXPECT_EQ(strings_of(ds.unbatch()), all);
  const Element rows = gather_rows({Tensor::from_vector({3, 2}, std::vector<std::string>{"a", "b", "c", "d", "e", "f"})}, std::vector<std::int64_t>{2, 0});
  EXPECT_EQ(std::vector<std::string>(rows[0].data<std::string>(), rows[0].data<std::string>() + 4),
            (std::vector<std::string>{"e", "f", "a", "b"}));
  // An element with strings stored in a record and read back.
  const std::string bytes = encode_element({Tensor::from_vector({2}, std::vector<std::string>{"x", std::string(3, '\0')})});
  Tensor record = Tensor::empty({static_cast<std::int64_t>(bytes.size())}, DType::u8);
  std::memcpy(record.raw_data(), bytes.data(), bytes.size());
  const Element back = decode_element(record);
  EXPECT_EQ(back[0].data<std::string>()[1], std::string(3, '\0'));
}

// Numbers as spreadsheets write them: a leading '+', a value beyond float32's range (as
// float32 holds it), and a header after a UTF-8 byte order mark.
TEST_F(Files, CsvTakesSignedAndTinyNumbersAndAByteOrderMark) {
  const std::string f = write("signed.csv", "\xEF\xBB\xBFlabel,x,y\n1,+1.5,1e-50\n0,-2,+3e2\n");
  Iterator it = Dataset::csv({f}, {.label_column = "label"}).make_iterator();
  auto e = it.next();
  EXPECT_EQ((*e)[0].to_vector(), (std::vector<float>{1.5f, 0.0f}));
  EXPECT_EQ((*e)[1].item(), 1.0f);
  EXPECT_EQ(it.next()->at(0).to_vector(), (std::vector<float>{-2, 300}));
  // Past float32's largest it is inf, refused unless non-finite values are allowed; '+'
  // alone or twice is still no number.
  std::string m = message_of([&] { values(Dataset::csv({write("big.csv", "a\n1e50\n")})); });
  EXPECT_NE(m.find("'1e50' is beyond float32's range"), std::string::npos) << m;
  for (const char* field : {"+", "++1", "+-1"}) {
    m = message_of([&] { values(Dataset::csv({write("plus.csv", std::string("a\n") + field + "\n")})); });
    EXPECT_NE(m.find(std::string("'") + field + "' is not a number"), std::string::npos) << m;
  }
}

TEST_F(Files, RecordsRoundTripAndCorruptionNamesTheOffset) {
  const std::string path = (dir_ / "r.rec").string();
  {
    RecordWriter w(path);
    for (int i = 0; i < 4; ++i)
      w.write(encode_element({Tensor::from_vector({2}, {float(i), float(i * 10)}), Tensor::scalar(float(i))}));
    w.close();
  }
  Dataset ds = Dataset::records({path}).map([](const Element& e) { return decode_element(e[0]); });
  EXPECT_EQ(values(ds), (std::vector<int>{0, 0, 1, 10, 2, 20, 3, 30}));
  expect_resumes_exactly(ds, 2);

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t record = bytes.size() / 4;
  std::string corrupt = bytes;
  corrupt[record + 20] ^= 0x5a;  // inside the second record's data
  const std::string cpath = write("c.rec", corrupt);
  std::string m = message_of([&] { values(Dataset::records({cpath})); });
  EXPECT_NE(m.find(cpath), std::string::npos) << m;
  EXPECT_NE(m.find("offset " + std::to_string(record)), std::string::npos) << m;
  const std::string tpath = write("t.rec", bytes.substr(0, bytes.size() - 3));
  m = message_of([&] { values(Dataset::records({tpath})); });
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
}

// CRC-32C's check value and RFC 3720's (iSCSI) vectors of 32 zero and 32 0xff bytes.
TEST(Crc32c, MatchesThePublishedVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  EXPECT_EQ(crc32c(""), 0u);
  // Lengths around the 8-byte steps give the one byte-at-a-time answer.
  std::string text;
  for (int i = 0; i < 40; ++i) text += static_cast<char>(i * 37 + 11);
  for (std::size_t n = 0; n <= text.size(); ++n) {
    std::uint32_t c = ~0u;
    for (std::size_t i = 0; i < n; ++i) {
      c ^= static_cast<unsigned char>(text[i]);
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0x82f63b78u : 0u);
    }
    EXPECT_EQ(crc32c(std::string_view(text).substr(0, n)), ~c) << n << " bytes";
  }
}

// TFRecord files as TensorFlow frames them: these bytes (the records "" and "hello") were
// made by a second, independent path (Python's struct and a bitwise CRC-32C of its own).
TEST_F(Files, TfRecordFilesAreFramedAsTensorFlowFramesThem) {
  const std::string tensorflow_bytes = [] {
    const std::string hex = "000000000000000029039807d8ea82a20500000000000000eab2043e68656c6c6fbb1f1c19";
    std::string out;
    for (std::size_t i = 0; i < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
  }();
  const std::string path = (dir_ / "mine.tfrecord").string();
  {
    RecordWriter w(path, RecordFraming::tfrecord);
    w.write("");
    w.write("hello");
    w.close();
  }
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), tensorflow_bytes);
  const std::string theirs = write("theirs.tfrecord", tensorflow_bytes + tensorflow_bytes);
  std::vector<std::string> records;
  for (data::Iterator it = Dataset::tfrecord({theirs}).make_iterator(); auto e = it.next();)
    records.push_back(*(*e)[0].data<std::string>());
  EXPECT_EQ(records, (std::vector<std::string>{"", "hello", "", "hello"}));
  // dtrain's own record files are not TFRecord files: the checksums say so.
  const std::string m = message_of([&] { values(Dataset::records({theirs})); });
  EXPECT_NE(m.find("corrupt record at offset 0 (record 0)"), std::string::npos) << m;
}

TEST_F(Files, ACorruptTfRecordIsNamedByFileRecordAndOffset) {
  std::string bytes;
  const std::string path = (dir_ / "c.tfrecord").string();
  {
    RecordWriter w(path, RecordFraming::tfrecord);
    for (int i = 0; i < 3; ++i) w.write(std::string(10, static_cast<char>('a' + i)));
    w.close();
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_EQ(bytes.size(), 3u * 26);
  const auto read_all = [](const std::string& file) {
    for (data::Iterator it = Dataset::tfrecord({file}).make_iterator(); it.next();) {
    }
  };
  std::string corrupt = bytes;
  corrupt[26 + 12 + 3] ^= 0x01;  // one bit of the second record's data
  const std::string cpath = write("bad.tfrecord", corrupt);
  std::string m = message_of([&] { read_all(cpath); });
  EXPECT_NE(m.find(cpath + ": corrupt record at offset 26 (record 1): the data's checksum does not match"),
            std::string::npos) << m;
  std::string lying = bytes;
  lying[2 * 26 + 5] = 0x7f;  // the third record's length: about 2^47 bytes
  m = message_of([&] { read_all(write("lying.tfrecord", lying)); });
  EXPECT_NE(m.find("corrupt record at offset 52 (record 2): the length's checksum does not match"), std::string::npos)
      << m;
  m = message_of([&] { read_all(write("short.tfrecord", bytes.substr(0, bytes.size() - 2))); });
  EXPECT_NE(m.find("truncated record at offset 52 (record 2)"), std::string::npos) << m;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// zlib's own one-shot inflate (a zlib stream, or with 15 + 16 a gzip member): a second path
// to the bytes a compressed writer wrote.
std::string inflated(const std::string& compressed, int window_bits) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, window_bits), Z_OK);
  std::string out(1 << 20, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  z.avail_in = static_cast<uInt>(compressed.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  inflateEnd(&z);
  return out;
}

TEST_F(Files, CompressedTfRecordFilesHoldTheFramedRecordsAsOneStream) {
  std::vector<std::string> records;
  for (int i = 0; i < 200; ++i) records.push_back(std::string(static_cast<std::size_t>(i * 7 % 300), static_cast<char>('a' + i % 26)));
  const std::string plain = (dir_ / "p.tfrecord").string();
  {
    RecordWriter w(plain, RecordFraming::tfrecord);
    for (const auto& r : records) w.write(r);
  }
  for (const auto& [compression, bits] : {std::pair{Compression::zlib, 15}, std::pair{Compression::gzip, 15 + 16}}) {
    const std::string name = std::string(compression_name(compression));
    const std::string path = (dir_ / ("c." + name)).string();
    {
      RecordWriter w(path, RecordFraming::tfrecord, compression, 9);
      for (std::size_t i = 0; i < records.size(); ++i) {
        w.write(records[i]);
        if (i == 50) w.flush();  // a sync point inside the stream reads through
      }
    }
    const std::string compressed = file_bytes(path);
    EXPECT_LT(compressed.size(), file_bytes(plain).size() / 4) << name;
    EXPECT_EQ(inflated(compressed, bits), file_bytes(plain)) << name;
    std::vector<std::string> got;
    for (Iterator it = Dataset::tfrecord({path}, compression).make_iterator(); auto e = it.next();)
      got.push_back(*(*e)[0].data<std::string>());
    EXPECT_EQ(got, records) << name;
    // A position saved in the inflated stream is found again.
    const Dataset ds = Dataset::tfrecord({path, path}, compression).map([](const Element& e) {
      return Element{Tensor::scalar(static_cast<float>(e[0].data<std::string>()->size()))};
    });
    for (int k : {0, 3, 250}) expect_resumes_exactly(ds, k);
    // Read as the wrong kind, or cut short: named.
    std::string m = message_of([&] { values(Dataset::tfrecord({path}, compression == Compression::zlib ? Compression::gzip : Compression::zlib)); });
    EXPECT_NE(m.find(path + ": record 0 (at offset 0 of the inflated data): the compressed data is corrupt"), std::string::npos) << m;
    const std::string cut = write("cut." + name, compressed.substr(0, compressed.size() / 2));
    // The error names the first record it keeps from being read whole: every one before it is read.
    int whole = 0;
    m = message_of([&] { for (Iterator it = Dataset::tfrecord({cut}, compression).make_iterator(); it.next();) ++whole; });
    EXPECT_GT(whole, 0) << m;
    EXPECT_NE(m.find(cut + ": record " + std::to_string(whole) + " "), std::string::npos) << m;
    EXPECT_NE(m.find("of the inflated data): the compressed data ends early"), std::string::npos) << m;
  }
  // gzip members one after another (as `cat a.gz b.gz` makes) read as one stream.
  const std::string one = (dir_ / "one.gz").string();
  {
    RecordWriter w(one, RecordFraming::tfrecord, Compression::gzip);
    w.write("x");
  }
  const std::string two = write("two.gz", file_bytes(one) + file_bytes(one));
  std::vector<std::string> got;
  for (Iterator it = Dataset::tfrecord({two}, Compression::gzip).make_iterator(); auto e = it.next();)
    got.push_back(*(*e)[0].data<std::string>());
  EXPECT_EQ(got, (std::vector<std::string>{"x", "x"}));
  EXPECT_EQ(compression_named("", "t"), Compression::none);
  EXPECT_NE(message_of([] { compression_named("LZ4", "TFRecordDataset"); }).find("TFRecordDataset: compression_type 'LZ4'"),
            std::string::npos);
}

TEST_F(Files, ALyingLengthInACompressedTfRecordCostsOnlyTheDataThere) {
  const std::string path = (dir_ / "lying.gz").string();
  std::string frame(12, '\0');
  frame[5] = 0x7f;  // about 2^47 bytes announced
  const std::uint32_t crc = masked_crc32c(crc32c(std::string_view(frame).substr(0, 8)));
  for (int i = 0; i < 4; ++i) frame[8 + i] = static_cast<char>(crc >> (8 * i));
  {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, frame.data(), static_cast<unsigned>(frame.size()));
    gzwrite(f, "abc", 3);
    gzclose(f);
  }
  const std::string m = message_of([&] { values(Dataset::tfrecord({path}, Compression::gzip)); });
  EXPECT_NE(m.find(path + ": truncated record at offset 0 of the inflated data (record 0, " + std::to_string(std::uint64_t{0x7f} << 40) +
                        " bytes announced)"),
            std::string::npos) << m;
}

// TensorFlow's documented example: range(1, 6).interleave(lambda x: from_tensors(x).repeat(6),
// cycle_length=2, block_length=4).
TEST(Dataset, InterleaveReadsInTensorFlowsOrder) {
  const auto six_of = [](const Element& e) {
    const int x = static_cast<int>(e[0].item());
    return Dataset::range(x, x + 1).repeat(6);
  };
  const std::vector<int> want{1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5};
  EXPECT_EQ(values(Dataset::range(1, 6).interleave(six_of, 2, 4)), want);
  // Read ahead on threads of their own (which it does only where the consumer's compute
  // threads leave a core idle), the same order; and in turn where they do not.
  {
    const ScopedThreads leave_a_core(std::max(1, available_cores() - 1));
    EXPECT_EQ(values(Dataset::range(1, 6).interleave(six_of, 2, 4, 2)), want);
    for (int k : {0, 4, 29})
      expect_resumes_exactly(Dataset::range(1, 6).interleave(six_of, 2, 4, 2).map([](const Element& e) {
        return Element{Tensor::scalar(e[0].item())};
      }), k);
  }
  EXPECT_EQ(values(Dataset::range(1, 6).interleave(six_of, 2, 4, 2)), want);
  // Datasets of different lengths: a finished one's slot takes the next input.
  const auto count_of = [](const Element& e) {
    const int x = static_cast<int>(e[0].item());
    return Dataset::range(10 * x, 10 * x + x);
  };
  EXPECT_EQ(values(Dataset::range(1, 5).interleave(count_of, 2, 1)),
            (std::vector<int>{10, 20, 21, 30, 31, 40, 32, 41, 42, 43}));
  for (int k : {0, 1, 4, 7, 15, 29})
    expect_resumes_exactly(Dataset::range(1, 6).interleave(six_of, 2, 4, 2).map([](const Element& e) {
      return Element{Tensor::scalar(e[0].item())};
    }), k);
  EXPECT_NE(message_of([&] { Dataset::range(3).interleave(six_of, 0); }).find("cycle_length must be"), std::string::npos);
  const std::string m = message_of([&] {
    values(Dataset::range(3).interleave([](const Element& e) -> Dataset {
      if (e[0].item() == 2) DTRAIN_THROW(IoError, "no such shard");
      return Dataset::range(1);
    }, 1));
  });
  EXPECT_NE(m.find("interleave: input element 2: no such shard"), std::string::npos) << m;
}

TEST_F(Files, ListedFilesInterleavedAndShardedByFile) {
  std::vector<std::string> files;
  for (int f = 0; f < 4; ++f) {
    const std::string path = (dir_ / ("part-" + std::to_string(f) + ".tfrecord")).string();
    RecordWriter w(path, RecordFraming::tfrecord);
    for (int r = 0; r < 3; ++r) w.write(std::to_string(10 * f + r));
    files.push_back(path);
  }
  write("other.txt", "x");
  EXPECT_EQ(Dataset::glob({(dir_ / "part-*.tfrecord").string()}), files);
  const std::string m = message_of([&] { Dataset::glob({(dir_ / "none-*").string()}); });
  EXPECT_NE(m.find("list_files: no files match the pattern '" + (dir_ / "none-*").string() + "'"), std::string::npos) << m;
  const auto read = [](const Dataset& ds) {
    std::vector<int> out;
    for (Iterator it = ds.make_iterator(); auto e = it.next();) out.push_back(std::stoi(*(*e)[0].data<std::string>()));
    return out;
  };
  const auto reader = [](const Element& e) { return Dataset::tfrecord({*e[0].data<std::string>()}); };
  EXPECT_EQ(read(Dataset::file_names(files).interleave(reader, 2, 1)),
            (std::vector<int>{0, 10, 1, 11, 2, 12, 20, 30, 21, 31, 22, 32}));
  // TFRecordDataset(files, num_parallel_reads=4): a record of each file in turn.
  EXPECT_EQ(read(Dataset::tfrecord(files, Compression::none, 4)),
            (std::vector<int>{0, 10, 20, 30, 1, 11, 21, 31, 2, 12, 22, 32}));
  // Sharded by file, worker 1 of 2 lists files 1 and 3 and reads each whole.
  const Dataset sharded = Dataset::file_names(files).interleave(reader, 2, 1).batch(4).shard_by_file(2, 1);
  EXPECT_EQ(Dataset::file_names(files).interleave(reader, 2, 1).input_files(), 4);
  std::vector<int> mine;
  for (Iterator it = sharded.make_iterator(); auto e = it.next();)
    for (std::int64_t i = 0; i < (*e)[0].numel(); ++i) mine.push_back(std::stoi((*e)[0].data<std::string>()[i]));
  EXPECT_EQ(mine, (std::vector<int>{10, 30, 11, 31, 12, 32}));
}

TEST_F(Files, ShardingByFileGivesEachWorkerItsFilesAndItsPartOfEachBatch) {
  // Four CSV files holding 0-2, 10-11, 20-23 and 30: worker w of 2 reads files w and w + 2.
  const std::vector<std::string> files = {write("p0.csv", "0\n1\n2\n"), write("p1.csv", "10\n11\n"),
                                          write("p2.csv", "20\n21\n22\n23\n"), write("p3.csv", "30\n")};
  const Dataset global = Dataset::csv(files, {.header = false}).batch(5).prefetch(2);
  EXPECT_EQ(global.input_files(), 4);
  EXPECT_EQ(Dataset::range(4).batch(2).input_files(), 0);
  // A global batch of 5 rows: 3 from worker 0, 2 from worker 1.
  auto batches = [](const Dataset& ds) {
    std::vector<std::vector<int>> out;
    Iterator it = ds.make_iterator();
    while (auto e = it.next()) {
      out.emplace_back();
      for (float v : (*e)[0].to_vector()) out.back().push_back(static_cast<int>(v));
    }
    return out;
  };
  EXPECT_EQ(batches(global.shard_by_file(2, 0)), (std::vector<std::vector<int>>{{0, 1, 2}, {20, 21, 22}, {23}}));
  EXPECT_EQ(batches(global.shard_by_file(2, 1)), (std::vector<std::vector<int>>{{10, 11}, {30}}));
  // Only the batch nearest the consumer is shared out; one below an unbatch() is not.
  const Dataset rebatched = Dataset::csv(files, {.header = false}).batch(2).unbatch().batch(4);
  EXPECT_EQ(batches(rebatched.shard_by_file(4, 2)), (std::vector<std::vector<int>>{{20}, {21}, {22}, {23}}));
  // A saved position resumes exactly within its own shard, and names it elsewhere.
  const Dataset worker1 = global.shard_by_file(2, 1);
  for (int k : {0, 1, 2}) expect_resumes_exactly(worker1, k);
  Iterator it = worker1.make_iterator();
  it.next();
  const IteratorState state = it.save();
  Iterator other = global.shard_by_file(2, 0).make_iterator();
  const std::string m0 = message_of([&] { other.restore(state); });
  EXPECT_NE(m0.find("belongs to worker 1 of 2, not to worker 0 of 2"), std::string::npos) << m0;
  // This worker's share of a take() below the batch is not the whole pipeline's count.
  const Dataset taken = Dataset::csv(files, {.header = false}).repeat().take(6).batch(2);
  EXPECT_EQ(taken.cardinality(), 3);
  EXPECT_EQ(taken.shard_by_file(2, 0).cardinality(), kUnknownCardinality);
  EXPECT_EQ(values(taken.shard_by_file(2, 0)), (std::vector<int>{0, 1, 2, 20, 21, 22}));
  EXPECT_EQ(global.repeat().shard_by_file(2, 0).cardinality(), kInfiniteCardinality);

  // AUTO resolves to FILE with enough files below a batch, else to DATA.
  WorkerShard shard = auto_shard(global, 3, 2);
  EXPECT_EQ(shard.policy, AutoShardPolicy::FILE);
  EXPECT_TRUE(shard.own_batches);
  EXPECT_NE(shard.plan.find("reads input files 2 (1 of 4)"), std::string::npos) << shard.plan;
  EXPECT_EQ(batches(shard.dataset), (std::vector<std::vector<int>>{{20}, {21}, {22}, {23}}));
  EXPECT_EQ(auto_shard(global, 5, 0).policy, AutoShardPolicy::DATA);
  EXPECT_FALSE(auto_shard(global, 5, 0).own_batches);
  EXPECT_EQ(auto_shard(Dataset::csv(files, {.header = false}).batch(3), 4, 0).policy, AutoShardPolicy::DATA);
  EXPECT_EQ(auto_shard(Dataset::csv(files, {.header = false}), 2, 0).policy, AutoShardPolicy::DATA);
  DatasetOptions off;
  off.auto_shard_policy = AutoShardPolicy::OFF;
  EXPECT_EQ(auto_shard(global.with_options(off), 2, 0).policy, AutoShardPolicy::OFF);
  EXPECT_FALSE(auto_shard(global.with_options(off), 1, 0).own_batches);

  // FILE asked for where it cannot be: the counts are named.
  DatasetOptions file;
  file.auto_shard_policy = AutoShardPolicy::FILE;
  std::string m = message_of([&] { auto_shard(global.with_options(file), 5, 0); });
  EXPECT_NE(m.find("reads 4 file(s) but there are 5 workers"), std::string::npos) << m;
  m = message_of([&] { auto_shard(Dataset::csv(files, {.header = false}).with_options(file), 2, 0); });
  EXPECT_NE(m.find("no batch() above its file source"), std::string::npos) << m;
  m = message_of([&] { auto_shard(Dataset::range(8).batch(2).with_options(file), 2, 0); });
  EXPECT_NE(m.find("reads 0 file(s)"), std::string::npos) << m;
  m = message_of([&] { Dataset::csv(files, {.header = false}).batch(3).shard_by_file(4, 3); });
  EXPECT_NE(m.find("a global batch of 3 rows cannot be shared out among 4 workers"), std::string::npos) << m;
  EXPECT_NE(message_of([&] { global.shard_by_file(2, 2); }).find("worker index 2 is out of range for 2"),
            std::string::npos);
  // A cache keeps each worker's own elements: once filled, the files are not read again.
  const Dataset cached = Dataset::csv(files, {.header = false}).cache().batch(4);
  EXPECT_EQ(values(cached), (std::vector<int>{0, 1, 2, 10, 11, 20, 21, 22, 23, 30}));
  EXPECT_EQ(values(cached.shard_by_file(2, 1)), (std::vector<int>{10, 11, 30}));
  for (const std::string& f : files) fs::remove(f);
  EXPECT_EQ(values(cached.shard_by_file(2, 1)), (std::vector<int>{10, 11, 30}));
  EXPECT_EQ(values(cached), (std::vector<int>{0, 1, 2, 10, 11, 20, 21, 22, 23, 30}));
}

TEST(Dataset, MisuseIsInvalidArgumentWithTheValues) {
  EXPECT_NE(message_of([] { Dataset::range(3).take(-5); }).find("-5"), std::string::npos);
  EXPECT_NE(message_of([] { Dataset::range(3).prefetch(0); }).find("0"), std::string::npos);
  EXPECT_NE(message_of([] { Dataset::range(3).map([](const Element& e) { return e; }, -7); }).find("-7"),
            std::string::npos);
  EXPECT_THROW(Dataset::range(3).with_options({.max_threads = -1}), InvalidArgument);
  EXPECT_THROW(Dataset::range(0, 5, 0), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::data
