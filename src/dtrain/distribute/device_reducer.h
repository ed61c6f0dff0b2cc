// Gradients summed over replicas that share one GPU (logical GPUs of it): once every
// replica's backward pass is over, each replica sums its share of the variables with the
// device's own kernels, into one buffer kept from step to step. Nothing crosses a bus: the
// replicas' gradients lie in the one device memory, and their kernels in its one queue, so
// a sum queued after a replica's backward reads what that backward wrote. This is what
// TensorFlow falls back to for replicas on one GPU (reduction to one device), since NCCL
// refuses two ranks on a GPU.
//
// Between workers (MultiWorkerMirroredStrategy with GPU workers), the buffer is then summed
// in place with NCCL where every worker has a GPU of its own and NCCL; else it is staged
// through pinned host memory: one copy to the host, the workers' all-reduce (the TCP ring,
// or shared memory where they share the host), one copy back. Not for GPUs with memories
// of their own in one process. Internal to the distribute layer.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/comm/in_process.h"
#include "dtrain/distribute/bucket_reducer.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::distribute::detail {

// `out` = the sum of the defined `inputs` (all on one device, of one shape and dtype), made
// there when undefined or of another shape; false (and `out` untouched) where none is
// defined.
bool sum_on_device(std::span<const Tensor> inputs, Tensor& out);

// Why GPU workers cannot sum in one NCCL group, in words (empty: they can). Worker w's GPU
// is `uuids[w]` (empty: one the runtime cannot name, the tests' stand-in) and `absences[w]`
// why that worker has no NCCL (empty: it has); `tasks[w]` names it. Every worker decides
// from the same lists, so all take the same path.
std::string nccl_refusal(const std::vector<std::string>& uuids, const std::vector<std::string>& absences,
                         const std::vector<std::string>& tasks);

// A worker's GPU buffer of every variable end to end (`parts` its variables), once its
// replicas' sums are in it, summed over the workers in place: with NCCL where the workers
// sum in one NCCL group (whether each variable had a gradient over the workers' own
// transport beside it), else through pinned host memory (the flags in the staged buffer's
// tail): one copy each way and the workers' all-reduce. Replica 0's work, after backward.
class WorkerSum {
 public:
  WorkerSum(CrossWorker cross, std::int64_t floats, std::size_t variables);
  // `had[i]`: this worker had variable i's gradient (its part is zeros otherwise, here);
  // then: whether any worker had.
  void sum(Tensor& flat, std::span<Tensor> parts, std::vector<char>& had, profile::Track* comm_track);
  bool nccl() const { return cross_.nccl != nullptr; }

 private:
  CrossWorker cross_;
  Tensor staged_;              // staged: the buffer, then a flag per variable, in pinned memory
  std::vector<float> flags_;   // NCCL: a flag per variable
};

class DeviceReducer final : public GradientReducer {
 public:
  // `vars`' gradients, float32 on `device`. Every wait for another replica lasts at most
  // `timeout` (twice that for replica 0's sum across workers, which may wait a whole
  // timeout for another worker itself).
  DeviceReducer(int replicas, std::span<Variable* const> vars, Device device, std::chrono::milliseconds timeout,
                CrossWorker cross = {});

  void begin_step(bool reduce, std::span<const std::int64_t> row_bounds) override;
  void gradient_ready(int replica, std::size_t index, const Tensor& grad) override;
  void finish(int replica) override;
  // One list for every replica: written before the last replica leaves finish().
  const std::vector<Tensor>& reduced(int /*replica*/) const override { return reduced_; }
  void abort(int replica, const std::string& why) override;
  void set_profile(std::span<profile::Track* const> replicas, profile::Track* communication) override {
    tracks_.assign(replicas.begin(), replicas.end());
    comm_track_ = communication;
  }

 private:
  struct ReplicaState {
    std::vector<Tensor> in;    // [variable] what the sum reads this step (undefined: no gradient)
    std::vector<Tensor> sums;  // [variable] accumulating: the group's sum so far
    bool fresh = true;         // the first micro-batch of a group
  };

  int replicas_;
  Device device_;
  std::string what_;  // the profile's name for the sum
  bool reduce_ = true;
  CrossWorker cross_;
  comm::InProcessBarrier barrier_;
  comm::InProcessBarrier after_workers_;  // the replicas wait there for replica 0's sum across workers
  std::vector<ReplicaState> states_;  // [replica], each touched by its replica until the barrier
  Tensor flat_;                       // every variable's sum, end to end, on the device
  std::vector<Tensor> outputs_;       // [variable] its part of flat_, shaped like it
  std::vector<Tensor> reduced_;       // [variable] outputs_ where some replica had a gradient
  std::vector<std::vector<Tensor>> inputs_;  // [replica] its scratch list of one variable's gradients
  std::optional<WorkerSum> workers_;  // multi-worker: the sum across them
  std::vector<char> had_;             // [variable] (multi-worker) some replica here had a gradient
  std::vector<profile::Track*> tracks_;
  profile::Track* comm_track_ = nullptr;  // workers: the communication thread's
};

// Replicas on GPUs with memories of their own (MirroredStrategy over a machine's GPUs),
// each replica's variables a mirror on its GPU; or a GPU worker's one replica, its NCCL
// rank among the workers' (MultiWorkerMirroredStrategy, a GPU each). Each replica's gradients go into a buffer
// of every variable end to end on its GPU (a micro-batch's added there), cut into buckets
// as fit's CPU buckets are (the last variables first, `bucket_bytes` each). They are
// summed:
// - with NCCL, each replica a rank of one communicator of this process (`nccl[r]`), in
//   place on every GPU: each bucket as soon as backward has made it, on the
//   communicator's stream beside the compute stream, while backward goes on; every
//   replica starts the buckets in the same order (a bucket waits for those before it);
// - else, after backward, reduced to the first GPU (TensorFlow's ReductionToOneDevice):
//   replica 0 copies the others' buffers there and adds them with its kernels.
// A GPU worker of one replica sums which variables had a gradient with NCCL too, after
// backward. The optimizer then updates the variables once, on the first GPU, from reduced(); the
// strategy copies them to the other GPUs before the replicas run again.
class MultiGpuReducer final : public GradientReducer {
 public:
  // `overlap` false: the buckets start after backward (a synchronized batch norm's sums
  // inside backward must not wait behind a bucket that waits for another replica).
  // `cross`: GPU workers of several GPUs each; after the sum over this worker's GPUs, the
  // first GPU's buffer is summed over the workers (WorkerSum).
  MultiGpuReducer(std::vector<Device> gpus, std::span<Variable* const> vars, std::size_t bucket_bytes,
                  std::chrono::milliseconds timeout, std::vector<std::shared_ptr<comm::NcclGroup>> nccl,
                  bool overlap = true, CrossWorker cross = {});

  void begin_step(bool reduce, std::span<const std::int64_t> row_bounds) override;
  void gradient_ready(int replica, std::size_t index, const Tensor& grad) override;
  void finish(int replica) override;
  // Every replica's list is the first GPU's sums: the update runs there, once.
  const std::vector<Tensor>& reduced(int /*replica*/) const override { return reduced_; }
  // On the failed replica's thread: its NCCL rank is aborted there, and the others' waits
  // (or next collectives) abort theirs and throw.
  void abort(int replica, const std::string& why) override;
  void set_profile(std::span<profile::Track* const> replicas, profile::Track* communication) override {
    tracks_.assign(replicas.begin(), replicas.end());
    comm_track_ = communication;
  }

 private:
  struct Bucket {
    std::size_t first = 0, last = 0;  // its variables [first, last]
    std::int64_t begin = 0, end = 0;  // its floats in the buffers
  };
  struct Replica {
    Tensor flat;                 // every variable's gradient, end to end, on its GPU
    std::vector<Tensor> parts;   // [variable] its part of flat
    std::vector<char> had;       // [variable] a gradient came this group
    std::vector<char> reported;  // [variable] reported in the reducing micro-batch
    std::vector<int> waiting;    // [bucket] its variables not yet reported
    std::size_t next = 0;        // the next bucket to start (NCCL)
    bool fresh = true;           // the next micro-batch starts a group
    Tensor scratch;              // (from replica 1, no NCCL) its buffer copied to the first GPU
    Tensor flags, flags_host;    // (NCCL) a flag per variable, summed over the ranks: on its GPU, pinned
  };
  // Variable `index` of `replica` is final for this step: zeros where it had no gradient,
  // and (NCCL) the buckets it completes are started, in order.
  void reported(Replica& replica, int r, std::size_t index);
  // (NCCL) Starts the replica's complete buckets, in order, up to the first incomplete one.
  void start_buckets(Replica& replica, int r);
  // A GPU worker's one replica, its NCCL rank among the workers': which variables had a
  // gradient is summed over them too (in one process the replicas' own lists say it).
  bool flags_over_nccl() const { return !nccl_.empty() && gpus_.size() == 1; }

  std::vector<Device> gpus_;
  std::vector<std::shared_ptr<comm::NcclGroup>> nccl_;  // [replica]; empty: reduce to the first GPU
  bool overlap_;
  bool reduce_ = true;
  comm::InProcessBarrier barrier_;
  std::vector<std::size_t> bucket_of_;  // [variable]
  std::vector<Bucket> buckets_;         // in the order started
  std::vector<Replica> replicas_;
  std::vector<Tensor> reduced_;         // [variable] the first replica's part where some replica had a gradient
  std::vector<char> any_;               // [variable] some replica (or worker) had a gradient this step
  std::optional<WorkerSum> workers_;    // GPU workers of several GPUs: the sum across them
  std::vector<profile::Track*> tracks_;
  profile::Track* comm_track_ = nullptr;
};

}  // namespace dtrain::distribute::detail
