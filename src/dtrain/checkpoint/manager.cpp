// CheckpointManager: the folder, its index, and the background writer.
#include "dtrain/checkpoint/manager.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <ostream>
#include <regex>

#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"
#include "dtrain/core/files.h"

namespace dtrain::train {
namespace {

constexpr const char* kIndex = "checkpoint";
constexpr const char* kIndexFormat = "dtrain.checkpoints";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

CheckpointManager::CheckpointManager(Checkpoint& checkpoint, std::string directory, CheckpointManagerOptions options)
    : checkpoint_(checkpoint), directory_(std::move(directory)), options_(std::move(options)) {
  if (directory_.empty()) DTRAIN_THROW(InvalidArgument, "CheckpointManager: the directory is empty");
  if (options_.max_to_keep < 0)
    DTRAIN_THROW(InvalidArgument, "CheckpointManager: max_to_keep must be >= 0, got ", options_.max_to_keep);
  if (options_.keep_checkpoint_every_n_hours < 0)
    DTRAIN_THROW(InvalidArgument, "CheckpointManager: keep_checkpoint_every_n_hours must be >= 0");
  if (options_.checkpoint_name.empty() || options_.checkpoint_name.find('/') != std::string::npos)
    DTRAIN_THROW(InvalidArgument, "CheckpointManager: checkpoint_name '", options_.checkpoint_name, "' must be a plain name");
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec || !std::filesystem::is_directory(directory_))
    DTRAIN_THROW(IoError, directory_, ": cannot make the checkpoint folder (", ec ? ec.message() : "not a folder", ")");
  if (!options_.clock) options_.clock = now_seconds;
  read_index();
  last_preserved_ = options_.clock();
}

CheckpointManager::~CheckpointManager() {
  if (writer_.joinable()) writer_.join();
}

void CheckpointManager::read_index() {
  kept_.clear();
  std::ifstream in(path_of(kIndex));
  if (!in) return;
  std::ostringstream whole;
  whole << in.rdbuf();
  const std::string text = whole.str();
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return;
  // Another program's index by that name (TensorFlow's, say) is not written over, nor are
  // the checkpoints it lists deleted with this folder's.
  auto foreign = [&](const std::string& what) {
    DTRAIN_THROW(InvalidArgument, path_of(kIndex), ": not a dtrain checkpoint index (", what,
                 "; another program's?); give dtrain another checkpoint folder, so that nothing in this one is "
                 "written over");
  };
  if (text[first] != '{') {
    const std::size_t line = std::min<std::size_t>(40, text.find('\n', first) - first);
    foreign("it begins '" + text.substr(first, line) + "'");
  }
  try {
    const nlohmann::json index = nlohmann::json::parse(text);
    if (index.is_object() && index.contains("format") && index["format"] != kIndexFormat)
      foreign("its format is " + index["format"].dump() + ", not '" + std::string(kIndexFormat) + "'");
    if (index.value("format", "") != kIndexFormat) return;
    for (const auto& e : index.at("checkpoints"))
      kept_.push_back({e.at("file").get<std::string>(), e.at("number").get<std::int64_t>(), e.at("time").get<double>()});
  } catch (const nlohmann::json::exception&) {
    kept_.clear();  // a damaged index: restore_latest() still finds the files themselves
  }
}

void CheckpointManager::write_index() const {
  nlohmann::json index;
  index["format"] = kIndexFormat;
  index["latest"] = kept_.empty() ? nlohmann::json() : nlohmann::json(kept_.back().file);
  nlohmann::json list = nlohmann::json::array();
  for (const Entry& e : kept_) list.push_back({{"file", e.file}, {"number", e.number}, {"time", e.time}});
  index["checkpoints"] = list;
  // Renamed into place but not fsync'd by itself: the index only lists the files, and
  // restore finds the checkpoints in the folder, so an index a power loss damaged costs
  // nothing. One folder fsync then covers the checkpoint's new name and the index's.
  write_file_replacing(path_of(kIndex), index.dump(1) + "\n", "the checkpoint index");
  sync_folder_of(path_of(kIndex));
}

void CheckpointManager::commit(Entry entry) {
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(), [&](const Entry& e) { return e.file == entry.file; }),
              kept_.end());
  kept_.push_back(std::move(entry));
  std::vector<Entry> removed;
  if (options_.max_to_keep > 0)
    while (static_cast<int>(kept_.size()) > options_.max_to_keep) {
      removed.push_back(kept_.front());
      kept_.erase(kept_.begin());
    }
  write_index();  // the index first: a crash now leaves files it does not list, never the reverse
  const double every = options_.keep_checkpoint_every_n_hours * 3600.0;
  for (const Entry& e : removed) {
    if (every > 0 && e.time - last_preserved_ >= every) {
      last_preserved_ = e.time;  // kept on disk, no longer managed
      continue;
    }
    std::remove(path_of(e.file).c_str());
  }
}

std::string CheckpointManager::save(std::optional<std::int64_t> checkpoint_number) {
  const Clock::time_point start = Clock::now();
  finish_writer("the checkpoint saved before this one");
  const double waited = seconds_since(start);
  StrategyBackend* workers = checkpoint_.multi_worker();
  const std::int64_t number = checkpoint_number.value_or(checkpoint_.save_counter() + 1);
  checkpoint_.set_save_counter(checkpoint_.save_counter() + 1);
  Entry entry{options_.checkpoint_name + "-" + std::to_string(number) + ".safetensors", number, options_.clock()};
  const std::string path = path_of(entry.file);
  const bool writes = !workers || workers->worker_index() == 0;
  if (!options_.async) {
    Snapshot direct;
    checkpoint_.snapshot(direct, /*copy=*/false);
    if (writes) {
      Checkpoint::write_snapshot(direct, path, /*sync_folder=*/false);
      commit(entry);
    }
    if (workers) check_same_state_on_every_worker(*workers, digest_of(direct), "checkpoint " + path);
    return path;
  }
  checkpoint_.snapshot(snapshot_, /*copy=*/true);  // the checksums too, on the compute threads
  if (workers) pending_digest_check_ = digest_of(snapshot_);
  digest_pending_ = workers != nullptr;
  ++statistics_.saves;
  statistics_.seconds_waiting += waited;
  statistics_.seconds_in_save += seconds_since(start);
  if (!writes) return path;
  writer_ = std::thread([this, entry, path] {
    // The writer keeps the process's priority. Its CPU time is small (the checksums come with
    // the snapshot, the block goes out by direct I/O from huge pages: about 1 ms a save), and
    // at SCHED_IDLE, where it ran before, training threads that kept every core busy starved
    // it until the next save() had to wait for it: 1.2% of a Fashion-MNIST fit backed up
    // every 100 steps, against none now (docs/benchmarks.md).
    const Clock::time_point wall = Clock::now();
    const double cpu = thread_cpu_seconds();
    try {
      Checkpoint::write_snapshot(snapshot_, path, /*sync_folder=*/false);
      commit(entry);
    } catch (...) {
      failure_ = std::current_exception();
    }
    writer_cpu_seconds_ = thread_cpu_seconds() - cpu;
    writer_seconds_ = seconds_since(wall);
  });
  return path;
}

void CheckpointManager::wait_for_writer() {
  if (writer_.joinable()) {
    writer_.join();
    statistics_.writer_cpu_seconds += writer_cpu_seconds_;
    statistics_.writer_seconds += writer_seconds_;
  }
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void CheckpointManager::finish_writer(const char* what) {
  wait_for_writer();
  if (!digest_pending_) return;
  digest_pending_ = false;
  if (StrategyBackend* workers = checkpoint_.multi_worker())
    check_same_state_on_every_worker(*workers, pending_digest_check_, what);
}

void CheckpointManager::sync() { finish_writer("the last checkpoint saved"); }

std::optional<std::string> CheckpointManager::latest_checkpoint() const {
  if (kept_.empty()) return std::nullopt;
  return path_of(kept_.back().file);
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::string> out;
  for (const Entry& e : kept_) out.push_back(path_of(e.file));
  return out;
}

std::vector<CheckpointManager::Entry> CheckpointManager::candidates() const {
  const std::regex pattern(std::regex_replace(options_.checkpoint_name, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                           R"(-([0-9]{1,18})\.safetensors)");
  std::vector<Entry> out;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(directory_, ec)) {
    const std::string name = f.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, pattern)) out.push_back({name, std::stoll(m[1].str()), 0});
  }
  if (ec) DTRAIN_THROW(IoError, directory_, ": cannot list the checkpoint folder (", ec.message(), ")");
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.number > b.number; });
  return out;
}

RestoredCheckpoint CheckpointManager::restore_latest(RestoreOptions options) {
  wait_for_writer();
  RestoredCheckpoint result;
  for (const Entry& e : candidates()) {
    const std::string path = path_of(e.file);
    try {
      checkpoint_.restore(path, options);
      result.path = path;
      result.number = e.number;
      break;
    } catch (const IoError& error) {
      // Damaged, cut short, unreadable, or not what this program tracks: an older one may do.
      // A checkpoint the program refuses (InvalidArgument: saved by another number of
      // workers, say) is not skipped: the older ones come from the same job.
      result.skipped.push_back({path, error.what()});
    }
    if (options_.log)
      *options_.log << "CheckpointManager: skipped " << path << ": " << result.skipped.back().reason << "\n";
  }
  if (StrategyBackend* workers = checkpoint_.multi_worker()) {
    Snapshot mine;
    checkpoint_.snapshot(mine, /*copy=*/false);
    check_same_state_on_every_worker(*workers, digest_of(mine),
                                     "the state restored from " + result.path.value_or("nothing (a fresh start)"));
  }
  return result;
}

void CheckpointManager::delete_all() {
  wait_for_writer();
  for (const Entry& e : candidates()) std::remove(path_of(e.file).c_str());
  std::remove(path_of(kIndex).c_str());
  kept_.clear();
}

}  // namespace dtrain::train
