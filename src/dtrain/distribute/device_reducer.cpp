// Replicas' gradients summed on the GPU they share.
#include "dtrain/distribute/device_reducer.h"

#include "dtrain/comm/gloo_group.h"
#include "dtrain/core/clock.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/distribute/worker_comm.h"
#include "dtrain/kernels/backend.h"

namespace dtrain::distribute::detail {

bool sum_on_device(std::span<const Tensor> inputs, Tensor& out) {
  const Tensor* first = nullptr;
  const Tensor* second = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (first && !(t.shape() == first->shape()))
      DTRAIN_THROW(InvalidArgument, "sum over replicas on ", t.device().to_string(), ": ", t.shape().to_string(),
                   " beside ", first->shape().to_string());
    if (first == nullptr) first = &t;
    else if (second == nullptr) second = &t;
  }
  if (first == nullptr) return false;
  if (!out.defined() || !(out.shape() == first->shape()) || out.dtype() != first->dtype() ||
      !(out.device() == first->device()))
    out = Tensor::empty(first->shape(), first->dtype(), first->device());
  if (second == nullptr) {
    out.copy_from(*first);
    return true;
  }
  kernels::Backend& backend = kernels::backend(first->device());
  backend.binary(kernels::Binary::add, *first, *second, out);
  bool past_second = false;
  for (const Tensor& t : inputs) {
    if (past_second && t.defined()) backend.binary(kernels::Binary::add, out, t, out);
    past_second = past_second || &t == second;
  }
  return true;
}

DeviceReducer::DeviceReducer(int replicas, std::span<Variable* const> vars, Device device,
                             std::chrono::milliseconds timeout, CrossWorker cross)
    : replicas_(replicas),
      device_(device),
      what_("sum gradients on " + device.to_string()),
      cross_(cross),
      // Replica threads mostly wait for the device: they sleep at once rather than spin.
      barrier_(replicas, /*spins=*/0, timeout, what_),
      after_workers_(replicas, /*spins=*/0, 2 * timeout, "gradient sum across workers (waiting for replica 0)"),
      states_(static_cast<std::size_t>(replicas)),
      outputs_(vars.size()),
      reduced_(vars.size()),
      inputs_(static_cast<std::size_t>(replicas)) {
  for (ReplicaState& s : states_) {
    s.in.resize(vars.size());
    s.sums.resize(vars.size());
  }
  std::int64_t total = 0;
  for (const Variable* v : vars) total += v->numel();
  flat_ = Tensor::zeros({total}, DType::f32, device);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < vars.size(); ++i) {
    outputs_[i] = flat_.slice(at, at + vars[i]->numel()).reshape(vars[i]->shape());
    at += vars[i]->numel();
  }
  if (cross_.workers) {
    workers_.emplace(cross_, total, vars.size());
    had_.resize(vars.size());
  }
}

WorkerSum::WorkerSum(CrossWorker cross, std::int64_t floats, std::size_t variables) : cross_(cross) {
  if (cross_.nccl) flags_.resize(variables);
  else staged_ = Tensor::empty_pinned({floats + static_cast<std::int64_t>(variables)});
}

void DeviceReducer::begin_step(bool reduce, std::span<const std::int64_t> /*row_bounds*/) { reduce_ = reduce; }

void DeviceReducer::gradient_ready(int replica, std::size_t index, const Tensor& grad) {
  if (grad.defined() && (grad.dtype() != DType::f32 || !(grad.shape() == outputs_[index].shape()) ||
                         !(grad.device() == device_)))
    DTRAIN_THROW(InternalError, "gradient sum on ", device_.to_string(), ": gradient ", index, " is ",
                 dtype_name(grad.dtype()), " ", grad.shape().to_string(), " on ", grad.device().to_string(),
                 ", expected float32 ", outputs_[index].shape().to_string());
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
  if (state.fresh && reduce_) {
    state.in[index] = grad;  // read where backward left it
    return;
  }
  // Accumulating: this replica's own sums, handed over on the group's last micro-batch.
  Tensor& sum = state.sums[index];
  if (state.fresh) sum = Tensor();
  if (grad.defined()) {
    if (!sum.defined()) sum = grad.clone();
    else kernels::backend(device_).binary(kernels::Binary::add, sum, grad, sum);
  }
  if (reduce_) state.in[index] = sum;
}

void DeviceReducer::finish(int replica) {
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
  state.fresh = reduce_;  // after a reduction, the next micro-batch starts a new group
  if (!reduce_) return;
  const Clock::time_point start = Clock::now();
  profile::Track* track = tracks_.empty() ? nullptr : tracks_[static_cast<std::size_t>(replica)];
  barrier_.arrive_and_wait(replica);
  // Every replica's gradients are queued on the device: each replica sums its share.
  std::vector<Tensor>& inputs = inputs_[static_cast<std::size_t>(replica)];
  for (std::size_t i = static_cast<std::size_t>(replica); i < outputs_.size(); i += static_cast<std::size_t>(replicas_)) {
    inputs.clear();
    for (const ReplicaState& s : states_) inputs.push_back(s.in[i]);
    reduced_[i] = sum_on_device(inputs, outputs_[i]) ? outputs_[i] : Tensor();
  }
  inputs.clear();
  barrier_.arrive_and_wait(replica);
  // Nobody reads this replica's gradients any more.
  for (Tensor& t : state.in) t = Tensor();
  const Clock::time_point summed = Clock::now();
  if (track) track->add(profile::Phase::communication, start, summed, what_.c_str());
  if (!cross_.workers) return;
  if (replica == 0) {
    try {
      for (std::size_t i = 0; i < reduced_.size(); ++i) had_[i] = reduced_[i].defined();
      workers_->sum(flat_, outputs_, had_, comm_track_);
      for (std::size_t i = 0; i < reduced_.size(); ++i) reduced_[i] = had_[i] ? outputs_[i] : Tensor();
    } catch (const std::exception& e) {
      after_workers_.abort(0, e.what());  // the others stop waiting for it
      throw;
    }
    if (track) {
      const Clock::time_point end = Clock::now();
      track->add(profile::Phase::communication, summed, end,
                 workers_->nccl() ? "sum across workers (NCCL)" : "sum across workers, through pinned host memory");
      track->add_wait_for_communication_thread(seconds_between(summed, end));
    }
  }
  after_workers_.arrive_and_wait(replica);
}

std::string nccl_refusal(const std::vector<std::string>& uuids, const std::vector<std::string>& absences,
                         const std::vector<std::string>& tasks) {
  for (std::size_t w = 0; w < absences.size(); ++w)
    if (!absences[w].empty()) return tasks[w] + " has no NCCL: " + absences[w];
  for (std::size_t w = 0; w < uuids.size(); ++w) {
    if (uuids[w].empty()) return tasks[w] + "'s GPU has no UUID to tell it from the others'";
    for (std::size_t v = 0; v < w; ++v)
      if (uuids[v] == uuids[w])
        return tasks[v] + " and " + tasks[w] + " share one GPU (" + uuids[w].substr(0, 8) +
               "...), and NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\")";
  }
  return "";
}

void WorkerSum::sum(Tensor& flat, std::span<Tensor> parts, std::vector<char>& had, profile::Track* comm_track) {
  const std::size_t n = parts.size(), total = static_cast<std::size_t>(flat.numel());
  const Device device = flat.device();
  // A variable no replica here had a gradient for counts as zeros; a flag per variable says
  // which had one (the staged buffer's tail, or a list of their own beside NCCL).
  float* flags = cross_.nccl ? flags_.data() : staged_.data<float>() + total;
  for (std::size_t i = 0; i < n; ++i) {
    flags[i] = had[i] ? 1.0f : 0.0f;
    if (!had[i]) kernels::backend(device).fill(parts[i], 0.0f);
  }
  if (cross_.nccl) {
    // The flags over the workers' own transport; the values in place on the GPU.
    cross_.workers->run([&](comm::GlooGroup& group) { group.allreduce(flags, n, ~std::uint64_t{2}, comm::Wire::f32); });
    const Clock::time_point start = Clock::now();
    cross_.nccl->all_reduce(static_cast<float*>(flat.raw_device_data()), total);
    if (comm_track) {
      comm_track->add(profile::Phase::communication, start, Clock::now(), "all-reduce across workers (NCCL)");
      comm_track->add_bytes(total * sizeof(float));
    }
  } else {
    Tensor values = staged_.slice(0, static_cast<std::int64_t>(total));
    values.copy_from(flat);  // waits for the sums
    // A key of its own, apart from the buffers of strategy.reduce (~0) and of CPU buckets.
    cross_.workers->run([&](comm::GlooGroup& group) {
      const Clock::time_point start = Clock::now();
      group.allreduce(staged_.data<float>(), total + n, ~std::uint64_t{1}, cross_.wire);
      if (comm_track) {
        // The wait for a late peer is its own phase; the rest moved the bytes.
        const Clock::time_point joined = start + group.last_peer_wait(), end = Clock::now();
        if (joined > start) comm_track->add(profile::Phase::straggler_wait, start, joined, "waiting for peers");
        comm_track->add(profile::Phase::communication, joined, end, "all-reduce across workers");
        comm_track->add_bytes(comm::wire_bytes(total + n, cross_.wire));
      }
    });
    flat.copy_from(values);
  }
  for (std::size_t i = 0; i < n; ++i) had[i] = flags[i] > 0.0f;
}

void DeviceReducer::abort(int replica, const std::string& why) {
  barrier_.abort(replica, why);
  after_workers_.abort(replica, why);
}

MultiGpuReducer::MultiGpuReducer(std::vector<Device> gpus, std::span<Variable* const> vars,
                                 std::size_t bucket_bytes, std::chrono::milliseconds timeout,
                                 std::vector<std::shared_ptr<comm::NcclGroup>> nccl, bool overlap,
                                 CrossWorker cross)
    : gpus_(std::move(gpus)),
      nccl_(std::move(nccl)),
      overlap_(overlap),
      barrier_(static_cast<int>(gpus_.size()), /*spins=*/0, timeout, "gradient sum over the GPUs"),
      replicas_(gpus_.size()),
      reduced_(vars.size()),
      any_(vars.size()) {
  std::vector<std::int64_t> numels, offsets;
  std::int64_t total = 0;
  for (const Variable* v : vars) {
    numels.push_back(v->numel());
    offsets.push_back(total);
    total += v->numel();
  }
  bucket_of_ = gradient_buckets(numels, bucket_bytes);
  buckets_.resize(vars.empty() ? 0 : bucket_of_.front() + 1);
  for (std::size_t i = vars.size(); i-- > 0;) {  // bucket 0 holds the last variables
    Bucket& b = buckets_[bucket_of_[i]];
    if (b.end == b.begin) {
      b.last = i;
      b.end = offsets[i] + numels[i];
    }
    b.first = i;
    b.begin = offsets[i];
  }
  for (std::size_t r = 0; r < gpus_.size(); ++r) {
    Replica& rep = replicas_[r];
    rep.flat = Tensor::zeros({total}, DType::f32, gpus_[r]);
    for (std::size_t i = 0; i < vars.size(); ++i)
      rep.parts.push_back(rep.flat.slice(offsets[i], offsets[i] + numels[i]).reshape(vars[i]->shape()));
    rep.had.assign(vars.size(), 0);
    rep.reported.assign(vars.size(), 0);
    if (r > 0 && nccl_.empty()) rep.scratch = Tensor::empty({total}, DType::f32, gpus_[0]);
    if (flags_over_nccl()) {
      rep.flags = Tensor::empty({static_cast<std::int64_t>(vars.size())}, DType::f32, gpus_[r]);
      rep.flags_host = Tensor::empty_pinned({static_cast<std::int64_t>(vars.size())});
    }
  }
  if (cross.workers) workers_.emplace(cross, total, vars.size());
}

void MultiGpuReducer::begin_step(bool reduce, std::span<const std::int64_t>) {
  reduce_ = reduce;
  // The replicas' threads are not running: a new group forgets the last one's gradients,
  // and a reducing micro-batch's counts start afresh.
  for (Replica& rep : replicas_)
    if (rep.fresh) std::fill(rep.had.begin(), rep.had.end(), 0);
  if (!reduce) return;
  for (Replica& rep : replicas_) {
    std::fill(rep.reported.begin(), rep.reported.end(), 0);
    rep.waiting.assign(buckets_.size(), 0);
    for (std::size_t i = 0; i < bucket_of_.size(); ++i) ++rep.waiting[bucket_of_[i]];
    rep.next = 0;
  }
}

void MultiGpuReducer::gradient_ready(int replica, std::size_t index, const Tensor& grad) {
  Replica& rep = replicas_[static_cast<std::size_t>(replica)];
  const Device gpu = gpus_[static_cast<std::size_t>(replica)];
  if (grad.defined() && (grad.dtype() != DType::f32 || !(grad.shape() == rep.parts[index].shape()) ||
                         !(grad.device() == gpu)))
    DTRAIN_THROW(InternalError, "gradient sum over the GPUs: replica ", replica, "'s gradient ", index, " is ",
                 dtype_name(grad.dtype()), " ", grad.shape().to_string(), " on ", grad.device().to_string(),
                 ", expected float32 ", rep.parts[index].shape().to_string(), " on ", gpu.to_string());
  if (grad.defined()) {
    Tensor& part = rep.parts[index];
    // The group's first gradient of the variable is copied into the buffer, later ones added.
    if (!rep.had[index]) part.copy_from(grad);
    else kernels::backend(gpu).binary(kernels::Binary::add, part, grad, part);
    rep.had[index] = 1;
  }
  if (reduce_) reported(rep, replica, index);
}

void MultiGpuReducer::reported(Replica& rep, int r, std::size_t index) {
  if (rep.reported[index]) return;
  rep.reported[index] = 1;
  const Device gpu = gpus_[static_cast<std::size_t>(r)];
  if (!rep.had[index]) kernels::backend(gpu).fill(rep.parts[index], 0.0f);  // no gradient: zeros
  --rep.waiting[bucket_of_[index]];
  if (!nccl_.empty() && overlap_) start_buckets(rep, r);
}

void MultiGpuReducer::start_buckets(Replica& rep, int r) {
  // Buckets start in one order on every replica: each waits for those before it.
  while (rep.next < buckets_.size() && rep.waiting[rep.next] == 0) {
    const Bucket& b = buckets_[rep.next++];
    nccl_[static_cast<std::size_t>(r)]->start_all_reduce(static_cast<float*>(rep.flat.raw_device_data()) + b.begin,
                                                         static_cast<std::size_t>(b.end - b.begin));
  }
}

void MultiGpuReducer::abort(int replica, const std::string& why) {
  barrier_.abort(replica, why);
  for (std::size_t k = 0; k < nccl_.size(); ++k) {
    if (static_cast<int>(k) == replica) nccl_[k]->abort();
    else nccl_[k]->cancel(dtrain::detail::concat("replica ", replica, " failed: ", why));
  }
}

void MultiGpuReducer::finish(int replica) {
  const auto r = static_cast<std::size_t>(replica);
  Replica& rep = replicas_[r];
  rep.fresh = reduce_;  // after a reduction, the next micro-batch starts a new group
  if (!reduce_) return;
  const Clock::time_point start = Clock::now();
  // Variables backward never reported (no path from the loss) are final now.
  for (std::size_t i = 0; i < rep.parts.size(); ++i) reported(rep, replica, i);
  if (!nccl_.empty()) {
    comm::NcclGroup& ranks = *nccl_[r];
    start_buckets(rep, replica);  // every bucket is complete now
    ranks.finish_all_reduces();
    if (flags_over_nccl()) {
      // Which variables had a gradient on any rank: another worker's.
      float* flags = rep.flags_host.data<float>();
      for (std::size_t i = 0; i < rep.had.size(); ++i) flags[i] = rep.had[i] ? 1.0f : 0.0f;
      rep.flags.copy_from(rep.flags_host);
      ranks.all_reduce(static_cast<float*>(rep.flags.raw_device_data()), rep.had.size());
      rep.flags_host.copy_from(rep.flags);
    }
    barrier_.arrive_and_wait(replica);
  } else {
    barrier_.arrive_and_wait(replica);  // every replica's buffer is queued
    if (replica == 0) {
      kernels::Backend& first = kernels::backend(gpus_[0]);
      for (std::size_t k = 1; k < replicas_.size(); ++k) {
        replicas_[k].scratch.copy_from(replicas_[k].flat);  // after GPU k's backward; done when it returns
        first.binary(kernels::Binary::add, rep.flat, replicas_[k].scratch, rep.flat);
      }
    }
  }
  if (!tracks_.empty() && tracks_[r])
    tracks_[r]->add(profile::Phase::communication, start, Clock::now(),
                    nccl_.empty() ? "sum gradients on the first GPU" : "all-reduce over the GPUs (NCCL)");
  if (replica != 0) return;
  std::vector<char>& any = any_;
  for (std::size_t i = 0; i < reduced_.size(); ++i) {
    any[i] = 0;
    if (flags_over_nccl()) any[i] = rep.flags_host.data<float>()[i] > 0.0f;
    else
      for (const Replica& other : replicas_) any[i] = any[i] || other.had[i];
  }
  // GPU workers of several GPUs: this worker's sum, on its first GPU, over the workers.
  if (workers_) {
    const Clock::time_point summed = Clock::now();
    workers_->sum(rep.flat, rep.parts, any, comm_track_);
    if (!tracks_.empty() && tracks_[0])
      tracks_[0]->add(profile::Phase::communication, summed, Clock::now(),
                      workers_->nccl() ? "sum across workers (NCCL)" : "sum across workers, through pinned host memory");
  }
  for (std::size_t i = 0; i < reduced_.size(); ++i) reduced_[i] = any[i] ? rep.parts[i] : Tensor();
}

}  // namespace dtrain::distribute::detail
