// Synchronized batch normalization: under MirroredStrategy a residual CNN whose batch norms
// are synchronized trains to one device's weights and moving statistics on the same global
// batch; unsynchronized, each replica normalizes its own rows and the run differs.
#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/small_cnn.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

using distribute::MirroredStrategy;
using testing::random_images;
using testing::relative_difference;
using testing::small_cnn;

FitOptions sync_fit(std::int64_t batch) {
  FitOptions o;
  o.batch_size = batch;
  o.shuffle = false;
  o.verbose = 0;
  return o;
}

TEST(SyncBatchNorm, MirroredReplicasGiveOneDevicesWeightsAndMovingStatistics) {
  const auto [x, y] = random_images(6 * 32, 7);
  auto reference = small_cnn(true);
  reference->fit(x, y, sync_fit(32));
  for (int replicas : {2, 4}) {
    MirroredStrategy strategy(replicas);
    std::unique_ptr<Model> model;
    {
      auto scope = strategy.scope();
      model = small_cnn(true);
    }
    model->fit(x, y, sync_fit(32));
    const double diff = relative_difference(*model, *reference);  // the moving statistics included
    EXPECT_LE(diff, 1e-5) << replicas << " replicas";
    RecordProperty("relative_difference_" + std::to_string(replicas), std::to_string(diff));
  }
  // Unsynchronized, each of 2 replicas normalizes 16 rows by their own statistics.
  MirroredStrategy strategy(2);
  std::unique_ptr<Model> model;
  {
    auto scope = strategy.scope();
    model = small_cnn(false);
  }
  model->fit(x, y, sync_fit(32));
  EXPECT_GT(relative_difference(*model, *reference), 1e-3);
}

// A last batch of 3 rows leaves one of 4 replicas without rows: with batch norms summing
// over the replicas that is an error naming the rows, not a wait until the timeout.
TEST(SyncBatchNorm, AReplicaWithoutRowsIsAnErrorNotAWait) {
  const auto [x, y] = random_images(35, 8);
  MirroredStrategy strategy(4);
  std::unique_ptr<Model> model;
  {
    auto scope = strategy.scope();
    model = small_cnn(true);
  }
  try {
    model->fit(x, y, sync_fit(32));
    FAIL() << "fit accepted a batch that leaves a replica without rows";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a batch of 3 rows leaves replica 3 without rows"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtrain
