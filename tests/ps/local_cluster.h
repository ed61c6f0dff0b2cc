// A parameter-server cluster inside one test process: free 127.0.0.1 ports for a chief,
// workers and parameter servers, and the tasks other than the chief run on threads.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/cluster/launcher.h"
#include "dtrain/cluster/tf_config.h"
#include "dtrain/ps/cluster_coordinator.h"

namespace dtrain::testing {

// Under ThreadSanitizer every step of an in-process cluster (a dozen gRPC threads a task)
// takes about half a second: the tests take fewer steps there, with the same checks.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif

// The tests' options: a task whose chief failed stops by itself, and no call waits long.
inline distribute::ParameterServerOptions ps_options(distribute::Partitioner partitioner = {},
                                                     distribute::Consistency mode = {}) {
  distribute::ParameterServerOptions o;
  o.variable_partitioner = std::move(partitioner);
  o.consistency = mode;
  o.coordinator_timeout_seconds = 30;
  o.rpc_timeout_seconds = 20;
  return o;
}

// A chief, `workers` workers and `ps` parameter servers on free 127.0.0.1 ports.
class LocalCluster {
 public:
  LocalCluster(int workers, int ps)
      : spec_(cluster::local_cluster(workers, ps, /*chief=*/true, cluster::free_ports(1 + workers + ps))) {}
  cluster::TfConfig config(const std::string& type, int index) const {
    cluster::TfConfig c;
    c.cluster = spec_;
    c.task = {type, index};
    c.from_environment = true;
    return c;
  }

 private:
  cluster::ClusterSpec spec_;
};

// Runs the cluster's other tasks on threads; joins them when destroyed.
class Tasks {
 public:
  ~Tasks() { join(); }
  void join() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  void add(std::function<void()> program) {
    threads_.emplace_back([this, program = std::move(program)] {
      try {
        program();
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex_);
        errors_.push_back(e.what());
      }
    });
  }
  std::vector<std::string> errors() {
    std::lock_guard lock(mutex_);
    return errors_;
  }

 private:
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::vector<std::string> errors_;
};

}  // namespace dtrain::testing
