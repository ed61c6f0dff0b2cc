// Device names, the runtime registry, and the calling thread's placement.
#include "dtrain/core/device.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>

#include "dtrain/core/block_cache.h"
#include "dtrain/core/error.h"

#if DTRAIN_CUDA
#include "dtrain/core/cuda_runtime.h"
#endif

namespace dtrain {

std::string Device::to_string() const {
  return (type == DeviceType::cpu ? "cpu:" : "cuda:") + std::to_string(index);
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

[[noreturn]] void bad_name(std::string_view name) {
  DTRAIN_THROW(InvalidArgument, "device '", name,
               "' is not a device name; expected \"/GPU:0\", \"/CPU:0\", \"gpu\", \"cuda:0\" or \"cpu\"");
}

}  // namespace

void DeviceRuntime::begin_capture(int index) {
  DTRAIN_THROW(NotCapturable, "the ", name(), " runtime of cuda:", index, " cannot record graphs");
}

DeviceGraph DeviceRuntime::end_capture(int /*index*/, bool /*keep*/) { return nullptr; }

void DeviceRuntime::replay(int index, const DeviceGraph& /*graph*/) {
  DTRAIN_THROW(NotCapturable, "the ", name(), " runtime of cuda:", index, " cannot replay graphs");
}

namespace {
thread_local int captured_device = -1;
}  // namespace

int detail::capturing_device() { return captured_device; }
void detail::set_capturing_device(int index) { captured_device = index; }
bool capturing_a_graph() { return captured_device >= 0; }

namespace {

struct LogicalConfigs {
  std::mutex mutex;
  std::map<int, std::vector<LogicalDeviceConfiguration>> by_gpu;  // physical index -> its parts
};

LogicalConfigs& logical_configs() {
  static LogicalConfigs* configs = new LogicalConfigs();  // leaked: names are parsed during exit
  return *configs;
}

// Logical GPU `index` (TensorFlow's "/gpu:N") as its physical GPU.
Device logical_gpu(int index, std::string_view name) {
  {
    LogicalConfigs& c = logical_configs();
    std::lock_guard lock(c.mutex);
    if (c.by_gpu.empty()) return Device::cuda(index);  // every GPU is one device
  }
  const std::vector<LogicalGpu> gpus = logical_gpus();
  if (index >= static_cast<int>(gpus.size()))
    DTRAIN_THROW(InvalidArgument, "device '", name, "' is not here: there are ", gpus.size(),
                 " logical GPUs (set_logical_device_configuration split ", describe_devices(DeviceType::cuda), ")");
  return gpus[static_cast<std::size_t>(index)].physical;
}

}  // namespace

std::string Device::tf_name() const {
  if (type == DeviceType::cpu) return "/device:CPU:" + std::to_string(index);
  // TensorFlow's GPU names count logical GPUs: a GPU is named by its first, after those of
  // the GPUs before it (each as many as it is split into).
  LogicalConfigs& c = logical_configs();
  std::lock_guard lock(c.mutex);
  int first = 0;
  for (int g = 0; g < index; ++g) {
    const auto it = c.by_gpu.find(g);
    first += it == c.by_gpu.end() ? 1 : static_cast<int>(it->second.size());
  }
  return "/device:GPU:" + std::to_string(first);
}

Device parse_device(std::string_view name) {
  std::string s = lower(name);
  // TensorFlow's full names: /job:localhost/replica:0/task:0/device:GPU:0.
  if (starts_with(s, "/job:")) {
    const auto at = s.find("/device:");
    if (at == std::string::npos) bad_name(name);
    s = s.substr(at);
  }
  const bool physical = starts_with(s, "/physical_device:");
  for (std::string_view prefix : {"/physical_device:", "/device:", "device:", "/"})
    if (starts_with(s, prefix)) {
      s = s.substr(prefix.size());
      break;
    }
  std::string_view kind = s, number;
  if (const auto colon = s.find(':'); colon != std::string::npos) {
    kind = std::string_view(s).substr(0, colon);
    number = std::string_view(s).substr(colon + 1);
    if (number.empty() || number.size() > 6) bad_name(name);
    for (char c : number)
      if (!std::isdigit(static_cast<unsigned char>(c))) bad_name(name);
  }
  const int index = number.empty() ? 0 : std::stoi(std::string(number));
  if (kind == "cpu") return Device::cpu();
  if (kind == "cuda" || (kind == "gpu" && physical)) return Device::cuda(index);
  if (kind == "gpu") return logical_gpu(index, name);
  bad_name(name);
}

std::vector<LogicalGpu> logical_gpus() {
  const int gpus = device_count(DeviceType::cuda);
  LogicalConfigs& c = logical_configs();
  std::lock_guard lock(c.mutex);
  std::vector<LogicalGpu> out;
  for (int g = 0; g < gpus; ++g) {
    const auto it = c.by_gpu.find(g);
    if (it == c.by_gpu.end()) {
      out.push_back({Device::cuda(g), 0, 1, 0});
      continue;
    }
    const int parts = static_cast<int>(it->second.size());
    for (int p = 0; p < parts; ++p)
      out.push_back({Device::cuda(g), p, parts, it->second[static_cast<std::size_t>(p)].memory_limit_mb << 20});
  }
  return out;
}


void set_logical_device_configuration(Device gpu, const std::vector<LogicalDeviceConfiguration>& logical) {
  if (gpu.is_cpu())
    DTRAIN_THROW(InvalidArgument, "set_logical_device_configuration: ", gpu.tf_name(),
                 ": dtrain splits GPUs only; MirroredStrategy's replicas on the CPU are its own thread groups "
                 "(MirroredStrategy(n) or devices \"/cpu:0\", \"/cpu:1\", ...)");
  check_device(gpu);
  DeviceRuntime& runtime = *device_runtime(gpu.type);
  std::size_t limit = 0;  // bytes; 0 where some logical GPU has no limit of its own
  bool every_limited = !logical.empty();
  for (const LogicalDeviceConfiguration& l : logical) {
    every_limited = every_limited && l.memory_limit_mb > 0;
    limit += l.memory_limit_mb << 20;
  }
  if (!every_limited) limit = 0;
  const std::size_t total = runtime.properties(gpu.index).total_memory;
  if (limit > 0 && total > 0 && limit > total)
    DTRAIN_THROW(InvalidArgument, "set_logical_device_configuration: the memory_limit of ", logical.size(),
                 " logical GPUs on ", gpu.to_string(), " add up to ", format_bytes(limit), ", more than its ",
                 format_bytes(total));
  runtime.set_memory_limit(gpu.index, limit,
                           detail::concat("the memory_limit of its ", logical.size(), " logical GPUs"));
  LogicalConfigs& c = logical_configs();
  std::lock_guard lock(c.mutex);
  if (logical.empty()) c.by_gpu.erase(gpu.index);
  else c.by_gpu[gpu.index] = logical;
}

std::vector<LogicalDeviceConfiguration> logical_device_configuration(Device gpu) {
  LogicalConfigs& c = logical_configs();
  std::lock_guard lock(c.mutex);
  const auto it = c.by_gpu.find(gpu.index);
  return gpu.is_cpu() || it == c.by_gpu.end() ? std::vector<LogicalDeviceConfiguration>{} : it->second;
}

namespace {

std::array<DeviceRuntime*, 2>& overrides() {
  static std::array<DeviceRuntime*, 2> runtimes{};
  return runtimes;
}

}  // namespace

DeviceRuntime* device_runtime(DeviceType type) {
  if (type == DeviceType::cpu) return nullptr;
  if (DeviceRuntime* r = overrides()[static_cast<int>(type)]) return r;
#if DTRAIN_CUDA
  return &detail::cuda_runtime();
#else
  return nullptr;
#endif
}

void set_device_runtime(DeviceType type, DeviceRuntime* runtime) {
  if (type == DeviceType::cpu) DTRAIN_THROW(InvalidArgument, "set_device_runtime: the CPU has no runtime to replace");
  overrides()[static_cast<int>(type)] = runtime;
}

int device_count(DeviceType type) {
  if (type == DeviceType::cpu) return 1;
  DeviceRuntime* r = device_runtime(type);
  return r ? r->count() : 0;
}

std::string describe_devices(DeviceType type) {
  if (type == DeviceType::cpu) return "cpu:0";
  DeviceRuntime* r = device_runtime(type);
  if (r == nullptr) return "no GPU: this build of dtrain has no CUDA backend (built without the CUDA toolkit or with -DDTRAIN_CUDA=OFF)";
  const int n = r->count();
  if (n == 0) return "no GPU: " + r->absence();
  std::string out;
  for (int i = 0; i < n; ++i) {
    const DeviceProperties p = r->properties(i);
    char capability[16];
    std::snprintf(capability, sizeof capability, "%d.%d", p.compute_capability / 10, p.compute_capability % 10);
    out += (i ? ", " : "") + Device::cuda(i).to_string() + " (" + p.name + ", " + format_bytes(p.total_memory) +
           ", compute capability " + capability + ")";
  }
  return out;
}

void check_device(Device device) {
  if (device.is_cpu()) return;
  const int n = device_count(device.type);
  if (device.index < 0 || device.index >= n)
    DTRAIN_THROW(InvalidArgument, "device ", device.to_string(), " (", device.tf_name(), ") is not here; found ",
                 describe_devices(device.type));
}

Device resolve_device(std::string_view spec) {
  const std::string s = lower(spec);
  if (s == "auto") return device_count(DeviceType::cuda) > 0 ? Device::cuda(0) : Device::cpu();
  const Device d = parse_device(spec);
  check_device(d);
  return d;
}

namespace {

struct Placement {
  bool set = false;  // a guard is active
  Device device;
};

Placement& placement_slot() {
  thread_local Placement placement;
  return placement;
}

struct DefaultPlacement {
  std::mutex mutex;
  std::string spec = "cpu";
  std::optional<Device> resolved = Device::cpu();
};

DefaultPlacement& default_placement() {
  static DefaultPlacement* placement = new DefaultPlacement();  // leaked: read during exit
  return *placement;
}

}  // namespace

namespace detail {
std::optional<Device> exchange_placement(std::optional<Device> device) {
  if (device) check_device(*device);
  Placement& slot = placement_slot();
  std::optional<Device> before = slot.set ? std::optional<Device>(slot.device) : std::nullopt;
  slot = device ? Placement{true, *device} : Placement{};
  return before;
}
}  // namespace detail

void set_default_placement(std::string_view spec) {
  const std::string s = lower(spec);
  if (s != "auto") (void)parse_device(spec);  // a bad name is refused now, not at first use
  DefaultPlacement& d = default_placement();
  std::lock_guard lock(d.mutex);
  d.spec = std::string(spec);
  d.resolved.reset();
}

Device placement() {
  if (placement_slot().set) return placement_slot().device;
  DefaultPlacement& d = default_placement();
  std::lock_guard lock(d.mutex);
  if (!d.resolved) d.resolved = resolve_device(d.spec);
  return *d.resolved;
}

DevicePlacement::DevicePlacement(Device device) : saved_(placement_slot().device), saved_set_(placement_slot().set) {
  check_device(device);
  placement_slot() = {true, device};
}

DevicePlacement::~DevicePlacement() { placement_slot() = {saved_set_, saved_}; }

}  // namespace dtrain
