// Step-phase timers and their Chrome trace.
#include "dtrain/profile/profiler.h"

#include <algorithm>
#include <locale>
#include <ostream>
#include <sstream>
#include <utility>

#include "dtrain/core/files.h"
#include "dtrain/core/percentile.h"

namespace dtrain::profile {
namespace {

constexpr int index_of(Phase p) { return static_cast<int>(p); }

double micros(Clock::time_point from, Clock::time_point to) { return seconds_between(from, to) * 1e6; }

// A track's step: all its phases, and of them its own work (less what it spent
// communicating, waiting for peers, pushing and pulling, and the first step's setup).
struct TrackStep {
  double all = 0, work = 0;
};
TrackStep track_step(const PhaseSeconds& s) {
  TrackStep t;
  for (double x : s) t.all += x;
  t.work = t.all;
  for (Phase p : {Phase::communication, Phase::straggler_wait, Phase::push, Phase::pull, Phase::setup})
    t.work -= s[static_cast<std::size_t>(index_of(p))];
  return t;
}
// Trace times count from the steady clock's epoch, which every process on a host shares:
// the traces of a host's workers line up without any rebasing.
double micros_since_epoch(Clock::time_point t) { return micros(Clock::time_point{}, t); }

// JSON string contents: track names are the program's own, but quote them properly anyway.
void write_json_string(std::ostream& out, const std::string& s) {
  out << '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) out << ' ';
    else out << c;
  }
  out << '"';
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::input_wait: return "input wait";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::communication: return "communication";
    case Phase::straggler_wait: return "straggler wait";
    case Phase::optimizer: return "optimizer";
    case Phase::push: return "push";
    case Phase::pull: return "pull";
    case Phase::metrics: return "metrics";
    case Phase::setup: return "setup";
    case Phase::replica_start: return "replica start";
    case Phase::to_device: return "to device";
    case Phase::device_wait: return "device wait";
  }
  return "?";
}

void Track::add(Phase phase, Clock::time_point start, Clock::time_point end, const char* label) {
  seconds_[static_cast<std::size_t>(index_of(phase))] += seconds_between(start, end);
  if (tracing_) events_.push_back(Event{phase, label, micros_since_epoch(start), micros(start, end)});
}

void Track::add_to_trace(Phase phase, Clock::time_point start, Clock::time_point end, const char* label) {
  if (tracing_) events_.push_back(Event{phase, label, micros_since_epoch(start), micros(start, end)});
}

void Track::add_nested(Phase phase, Phase within, Clock::time_point start, Clock::time_point end, const char* label) {
  add(phase, start, end, label);
  seconds_[static_cast<std::size_t>(index_of(within))] -= seconds_between(start, end);
}

namespace {
thread_local Track* loop_track = nullptr;
}  // namespace

Track* current_loop_track() { return loop_track; }
ScopedLoopTrack::ScopedLoopTrack(Track& loop) : previous_(std::exchange(loop_track, &loop)) {}
ScopedLoopTrack::~ScopedLoopTrack() { loop_track = previous_; }

void Track::reset_step() {
  seconds_.fill(0.0);
  bytes_ = 0;
  waited_for_comm_ = 0;
}

void Totals::add(const StepRecord& r) {
  ++steps;
  wall += r.wall;
  for (int p = 0; p < kPhases; ++p) phases[static_cast<std::size_t>(p)] += r.phases[static_cast<std::size_t>(p)];
  communication_total += r.communication_total;
  transfer += r.transfer;
  bytes += r.bytes;
  samples += r.samples;
  for (int p = 0; p < kPhases; ++p) gpu[static_cast<std::size_t>(p)] += r.gpu[static_cast<std::size_t>(p)];
}

void Totals::add(const Totals& other) {
  steps += other.steps;
  wall += other.wall;
  for (int p = 0; p < kPhases; ++p) phases[static_cast<std::size_t>(p)] += other.phases[static_cast<std::size_t>(p)];
  communication_total += other.communication_total;
  transfer += other.transfer;
  bytes += other.bytes;
  samples += other.samples;
  for (int p = 0; p < kPhases; ++p) gpu[static_cast<std::size_t>(p)] += other.gpu[static_cast<std::size_t>(p)];
}

double Totals::gpu_seconds() const {
  double s = 0;
  for (double g : gpu) s += g;
  return s;
}

double Totals::unaccounted() const {
  double covered = 0;
  for (double s : phases) covered += s;
  return wall - covered;
}

Profiler::Profiler(ProfilerOptions options) : options_(options) {
  add_track("training loop", TrackKind::loop);
}

Track& Profiler::add_track(std::string name, TrackKind kind) {
  tracks_.push_back(std::make_unique<Track>(std::move(name), kind));
  Track& t = *tracks_.back();
  t.tracing_ = options_.trace && options_.max_trace_steps > 0;
  return t;
}

void Profiler::begin_epoch() {
  epoch_ = Totals{};
  if (++epochs_ == 2) steady_from_ = step_walls_.size();
}

void Profiler::begin_step() {
  for (auto& t : tracks_) t->reset_step();
  step_start_ = Clock::now();
}

const StepRecord& Profiler::end_step(std::int64_t samples) {
  const Clock::time_point now = Clock::now();
  StepRecord r;
  r.wall = seconds_between(step_start_, now);
  r.samples = samples;
  int replicas = 0;
  PhaseSeconds replica_sum{};
  double slowest_replica = 0, loop_phases = 0, longest_replica = 0;
  double replica_waits = 0, comm_thread = 0, comm_thread_straggler = 0;
  for (const auto& t : tracks_) {
    r.bytes += t->bytes_;
    switch (t->kind_) {
      case TrackKind::loop: {
        for (int p = 0; p < kPhases; ++p) r.phases[static_cast<std::size_t>(p)] += t->seconds_[static_cast<std::size_t>(p)];
        const TrackStep loop = track_step(t->seconds_);
        r.work += loop.work;
        loop_phases += loop.all;
        break;
      }
      case TrackKind::replica: {
        ++replicas;
        const TrackStep replica = track_step(t->seconds_);
        slowest_replica = std::max(slowest_replica, replica.work);
        longest_replica = std::max(longest_replica, replica.all);
        for (int p = 0; p < kPhases; ++p) replica_sum[static_cast<std::size_t>(p)] += t->seconds_[static_cast<std::size_t>(p)];
        replica_waits += t->waited_for_comm_;
        break;
      }
      case TrackKind::device:
        for (int p = 0; p < kPhases; ++p) r.gpu[static_cast<std::size_t>(p)] += t->seconds_[static_cast<std::size_t>(p)];
        break;
      case TrackKind::communication:
        comm_thread += t->seconds_[static_cast<std::size_t>(index_of(Phase::communication))];
        comm_thread_straggler += t->seconds_[static_cast<std::size_t>(index_of(Phase::straggler_wait))];
        break;
    }
  }
  // The step's own work: the loop's, the slowest replica's, and the time between the
  // records (a thread stopped by the scheduler between two phases), which no peer caused.
  r.work += slowest_replica + std::max(0.0, r.wall - loop_phases - longest_replica);
  if (replicas > 0) {
    for (int p = 0; p < kPhases; ++p)
      r.phases[static_cast<std::size_t>(p)] += replica_sum[static_cast<std::size_t>(p)] / replicas;
    replica_waits /= replicas;
  }
  // Communication busy time: the replicas' own (in-process sums), less their waits for the
  // communication thread, plus that thread's; the slowest peer's lateness is its own phase.
  const auto comm = static_cast<std::size_t>(index_of(Phase::communication));
  const auto straggler = static_cast<std::size_t>(index_of(Phase::straggler_wait));
  r.communication_total = r.phases[comm] - replica_waits + comm_thread + comm_thread_straggler;
  r.transfer = comm_thread;
  // What the replicas waited for beyond their own work is exposed; as much of it as the
  // communication thread spent waiting for a late peer is straggler wait.
  const double late = std::min(replica_waits, comm_thread_straggler);
  r.phases[comm] -= late;
  r.phases[straggler] += late;

  last_ = r;
  epoch_.add(r);
  total_.add(r);
  if (epochs_ > 1) steady_.add(r);
  step_walls_.push_back(r.wall);
  step_works_.push_back(r.work);
  if (options_.trace && total_.steps <= options_.max_trace_steps) {
    step_spans_.emplace_back(micros_since_epoch(step_start_), micros(step_start_, now));
    if (total_.steps == options_.max_trace_steps)
      for (auto& t : tracks_) t->tracing_ = false;
  }
  return last_;
}

std::vector<double> Profiler::steady_work(std::size_t max_steps) const {
  const std::size_t from = epochs_ > 1 ? steady_from_ : 0;
  const std::size_t to = std::min(step_works_.size(), from + max_steps);
  if (to <= from) return {};
  return {step_works_.begin() + static_cast<std::ptrdiff_t>(from), step_works_.begin() + static_cast<std::ptrdiff_t>(to)};
}

double Profiler::step_percentile(double q) const {
  const std::size_t from = epochs_ > 1 ? steady_from_ : 0;
  if (step_walls_.size() <= from) return 0.0;
  return percentile({step_walls_.begin() + static_cast<std::ptrdiff_t>(from), step_walls_.end()}, q);
}

void Profiler::write_trace(std::ostream& to, int pid, const std::string& process_name) const {
  // Trace-event format: complete events ("ph": "X") with microsecond timestamps, and
  // metadata events naming the process and each thread. Numbers in the C locale whatever
  // the program's, and the caller's stream keeps its own formatting.
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << pid << ", \"tid\": 0, \"args\": {\"name\": ";
  write_json_string(out, process_name);
  out << "}}";
  for (std::size_t tid = 0; tid < tracks_.size(); ++tid) {
    out << ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " << pid << ", \"tid\": " << tid
        << ", \"args\": {\"name\": ";
    write_json_string(out, tracks_[tid]->name());
    out << "}}";
    out << ",\n{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": " << pid << ", \"tid\": " << tid
        << ", \"args\": {\"sort_index\": " << tid << "}}";
  }
  out.precision(3);
  out << std::fixed;
  for (std::size_t s = 0; s < step_spans_.size(); ++s)
    out << ",\n{\"ph\": \"X\", \"cat\": \"step\", \"name\": \"step " << s << "\", \"pid\": " << pid
        << ", \"tid\": 0, \"ts\": " << step_spans_[s].first << ", \"dur\": " << step_spans_[s].second << "}";
  for (std::size_t tid = 0; tid < tracks_.size(); ++tid)
    for (const Track::Event& e : tracks_[tid]->events_) {
      out << ",\n{\"ph\": \"X\", \"cat\": \"" << phase_name(e.phase) << "\", \"name\": ";
      write_json_string(out, e.label ? e.label : phase_name(e.phase));
      out << ", \"pid\": " << pid << ", \"tid\": " << tid << ", \"ts\": " << e.start_us << ", \"dur\": " << e.duration_us
          << "}";
    }
  out << "\n]}\n";
  to << out.str();
}

void Profiler::write_trace(const std::string& path, int pid, const std::string& process_name) const {
  std::ostringstream out;
  write_trace(out, pid, process_name);
  write_file_replacing(path, out.str(), "profile: the trace file");
}

}  // namespace dtrain::profile
