// Running a pipeline's background stages under clocks a test gives, so that the AUTOTUNE
// prefetch's inline rule (which reads the producer's wall and CPU time) does not depend on
// the scheduler.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/core/threads.h"
#include "dtrain/data/dataset.h"

namespace dtrain::testing {

// Clocks for a prefetch's producer under which each element takes a millisecond; the CPU
// clock moves with the wall clock (a producer that computes) or stands still (one that
// waits, as on a disk).
inline std::shared_ptr<const data::StageClocks> producer_clocks(bool computes) {
  auto ticks = std::make_shared<std::atomic<std::int64_t>>(0);
  return std::make_shared<const data::StageClocks>(data::StageClocks{
      [ticks] { return 1e-3 * static_cast<double>(++*ticks); },
      [ticks, computes] { return computes ? 1e-3 * static_cast<double>(ticks->load()) : 0.0; }});
}

// `ds` run as its iterator would run it, its prefetch reading `clocks`.
inline std::unique_ptr<data::IteratorBase> run_under(const data::Dataset& ds,
                                                     std::shared_ptr<const data::StageClocks> clocks) {
  data::IteratorContext ctx;
  ctx.options = ds.options();
  ctx.idle_core = num_threads() < available_cores();
  ctx.clocks = std::move(clocks);
  return ds.node()->make(ctx);
}

// Whether the iterator's last prefetch stopped its thread and pulled in the consumer's.
inline bool went_inline(const data::IteratorBase& it) {
  std::vector<std::string> lines;
  it.report(lines);
  return !lines.empty() && lines.back().find("inline in the consumer's thread") != std::string::npos;
}

}  // namespace dtrain::testing
