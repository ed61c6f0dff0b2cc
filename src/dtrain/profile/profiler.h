// Where the milliseconds of a training step went. A step is split into named phases
// (input wait, forward, backward, communication, straggler wait, optimizer, ...), timed
// per track: the training loop's thread, each replica's thread, and the communication
// thread that talks to other processes. The timers stay on (two clock reads per phase);
// a Chrome trace of every phase is kept only when asked for.
//
// Threads: each track is written by one thread at a time, and the step boundaries
// (begin_step, end_step) are called by the training loop while no other track is
// being written, so nothing here takes a lock on the hot path.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"

namespace dtrain::profile {

enum class Phase : std::uint8_t {
  input_wait,      // the training loop waited for the next batch
  forward,         // model and loss
  backward,        // gradients, less the communication done inside backward
  communication,   // summing gradients with other replicas and workers
  straggler_wait,  // blocked until the slowest peer joined a collective
  optimizer,       // applying the update
  push,            // parameter-server strategy: sending gradients
  pull,            // parameter-server strategy: fetching variables
  metrics,         // loss and metrics bookkeeping, callbacks, progress
  setup,           // the first step's building: model, gradient buckets, workers' agreement
  replica_start,   // from the step's hand-off to the replica threads until each one ran
  to_device,       // copying the batch to the GPU the model trains on
  device_wait,     // the host waited for the GPU to finish the step's queued work
};
inline constexpr int kPhases = 13;
// The steady steps whose work a run's summary keeps, for the doctor's replay of the run.
inline constexpr std::size_t kStepsReplayed = 1000;
const char* phase_name(Phase phase);  // "input wait", "forward", ...

using PhaseSeconds = std::array<double, kPhases>;

// device: a GPU's compute stream, its phases timed by the GPU itself (events on the stream)
// and placed on the host's clock; its time is the step's `gpu` figures, beside the host's
// phases, not part of them.
enum class TrackKind : std::uint8_t { loop, replica, communication, device };

// One thread's timeline.
class Track {
 public:
  Track(std::string name, TrackKind kind) : name_(std::move(name)), kind_(kind) {}
  const std::string& name() const { return name_; }

  // Adds [start, end) to this step's `phase` (and to the trace when one is kept).
  void add(Phase phase, Clock::time_point start, Clock::time_point end, const char* label = nullptr);
  // The same for work nested inside a phase its caller records around it (a bucket summed
  // during backward): the time counts as `phase` only, not also as `within`.
  void add_nested(Phase phase, Phase within, Clock::time_point start, Clock::time_point end, const char* label = nullptr);
  // [start, end) into the trace only, counted nowhere: detail inside a phase the track has
  // already recorded (a GPU's kernels within its forward).
  void add_to_trace(Phase phase, Clock::time_point start, Clock::time_point end, const char* label);
  // Whether the trace keeps this step's events.
  bool tracing() const { return tracing_; }
  // Communication-track bookkeeping: bytes this process all-reduced with the others.
  void add_bytes(std::uint64_t bytes) { bytes_ += bytes; }
  // Replica tracks: the part of their communication spent waiting for the communication
  // thread (already counted there), so that the step's total does not count it twice.
  void add_wait_for_communication_thread(double seconds) { waited_for_comm_ += seconds; }


 private:
  friend class Profiler;
  struct Event {
    Phase phase;
    const char* label;  // static text or null (the phase's name)
    double start_us, duration_us;
  };
  void reset_step();

  std::string name_;
  TrackKind kind_;
  PhaseSeconds seconds_{};
  std::uint64_t bytes_ = 0;
  double waited_for_comm_ = 0;
  bool tracing_ = false;
  std::vector<Event> events_;
};

// The loop track of the training steps running on this thread, while a ScopedLoopTrack
// names it, so that work deep inside a phase is recorded nested in it (the rows a
// parameter server's worker pulls during forward); null elsewhere.
Track* current_loop_track();
class ScopedLoopTrack {
 public:
  explicit ScopedLoopTrack(Track& loop);
  ~ScopedLoopTrack();
  ScopedLoopTrack(const ScopedLoopTrack&) = delete;
  ScopedLoopTrack& operator=(const ScopedLoopTrack&) = delete;

 private:
  Track* previous_;
};

// One step of this process, reduced over its tracks.
struct StepRecord {
  double wall = 0;
  // The loop's phases plus the mean of the replicas'; communication is the exposed part
  // (replicas not computing), straggler_wait the part of that spent on the slowest peer.
  PhaseSeconds phases{};
  double communication_total = 0;  // busy time of all communication, hidden or exposed
  double transfer = 0;             // the part that moved bytes between processes
  std::uint64_t bytes = 0;         // all-reduced with other processes
  std::int64_t samples = 0;        // global batch rows
  // On a GPU: the GPU's own time in the step's forward, backward and optimizer phases
  // (device tracks), where the host's phases were the launches and the device wait.
  PhaseSeconds gpu{};
  // The step's own work on its critical path: the loop's phases and the slowest replica's,
  // each less its communication, waits for peers, pushes, pulls and setup, and the time
  // between the records (the loop's and the longest replica's phases short of the wall).
  double work = 0;
};

// Totals over a run of steps (an epoch, or all of training).
struct Totals {
  std::int64_t steps = 0;
  double wall = 0;
  PhaseSeconds phases{};
  double communication_total = 0;
  double transfer = 0;
  std::uint64_t bytes = 0;
  std::int64_t samples = 0;
  PhaseSeconds gpu{};  // StepRecord::gpu, summed
  void add(const StepRecord& r);
  void add(const Totals& other);  // another run of steps (another worker's, another closure's)
  double share(Phase p) const { return wall > 0 ? phases[static_cast<int>(p)] / wall : 0.0; }
  // The GPU's time in the step's phases, all of them (0: no GPU track).
  double gpu_seconds() const;
  // Wall time not covered by any phase (thread start-up and joins, the step's own overhead).
  double unaccounted() const;
};

struct ProfilerOptions {
  bool trace = false;                 // keep events for a Chrome trace
  std::int64_t max_trace_steps = 1000;  // events of the first steps only (1000 steps: a few MB)
};

class Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Before training: one track per thread. Pointers stay valid for the profiler's life.
  Track& add_track(std::string name, TrackKind kind);
  Track& loop() { return *tracks_.front(); }

  void begin_step();
  // Closes the step, reduces its tracks into a StepRecord and adds it to the totals.
  const StepRecord& end_step(std::int64_t samples);
  // The epoch's totals so far; begin_epoch starts new ones.
  void begin_epoch();
  const Totals& epoch() const { return epoch_; }
  const Totals& total() const { return total_; }
  // Step wall time percentile over the steps steady() covers (q in [0, 1]).
  double step_percentile(double q) const;
  // The steady state: the steps after the first epoch when there were several (the
  // first warms up: setup, kernels' first calls, cold caches), else all of them.
  const Totals& steady() const { return epochs_ > 1 ? steady_ : total_; }
  // Each steady step's work (StepRecord::work), the first `max_steps` of them (the
  // summaries keep the first kStepsReplayed).
  std::vector<double> steady_work(std::size_t max_steps) const;
  std::int64_t steps() const { return total_.steps; }

  // Chrome trace-event JSON ({"traceEvents": [...]}): one track per thread, process `pid`
  // named `process_name`. Opens in Perfetto and chrome://tracing.
  void write_trace(std::ostream& out, int pid, const std::string& process_name) const;
  void write_trace(const std::string& path, int pid, const std::string& process_name) const;

 private:
  ProfilerOptions options_;
  std::vector<std::unique_ptr<Track>> tracks_;
  Clock::time_point step_start_{};
  StepRecord last_;
  Totals epoch_, total_, steady_;
  int epochs_ = 0;
  std::vector<double> step_walls_;
  std::vector<double> step_works_;  // [step], beside step_walls_
  std::size_t steady_from_ = 0;  // step_walls_ index of the steady state's first step
  std::vector<std::pair<double, double>> step_spans_;  // [step] start and duration, µs, traced steps
};

}  // namespace dtrain::profile
