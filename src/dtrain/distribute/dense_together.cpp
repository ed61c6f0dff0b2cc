// Dense layers' weight gradients computed by the replicas together.
#include "dtrain/distribute/dense_together.h"

#include "dtrain/core/error.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/backend.h"

namespace dtrain::distribute::detail {

class DenseTogether::Hook final : public DenseGradientsTogether {
 public:
  Hook(DenseTogether& owner, int replica) : owner_(owner), replica_(replica) {}

  bool takes(const Tensor& kernel) const override {
    for (const Layer& l : owner_.layers_)
      if (l.key == kernel.raw_data()) return true;
    return false;
  }

  void gradients(const Tensor& kernel, const Tensor& x, const Tensor& dz, Tensor& dw, Tensor& db) override {
    Layer& layer = owner_.layer_of(kernel);
    const auto r = static_cast<std::size_t>(replica_);
    // A second use would overwrite the first's rows while other replicas read them.
    if (layer.step_used[r] == owner_.step_)
      DTRAIN_THROW(InvalidArgument, owner_.vars_[layer.kernel]->name(),
                   " is read by two dense ops in one step (weights tied between layers, say); under "
                   "MirroredStrategy a dense layer's variables may be read by that layer only, once per step");
    layer.step_used[r] = owner_.step_;
    const std::int64_t mine = owner_.bounds_[r + 1] - owner_.bounds_[r];
    // Inputs with more axes than [batch, features] fold their leading axes into rows.
    const std::int64_t rows = x.dim(0);
    if (mine == 0 || rows % mine != 0 || dz.dim(0) != rows)
      DTRAIN_THROW(InternalError, "dense gradients together: replica ", replica_, " has ", mine,
                   " rows of the batch but gave ", rows, " rows of x and ", dz.dim(0), " of dz for '",
                   owner_.vars_[layer.kernel]->name(), "'");
    const std::int64_t per_row = rows / mine;
    const std::int64_t total = owner_.bounds_.back() * per_row, first = owner_.bounds_[r] * per_row;
    {
      std::lock_guard lock(owner_.buffers_mutex_);
      if (!layer.x.defined() || layer.x.dim(0) != total) {
        layer.x = Tensor::empty({total, x.dim(1)});
        layer.dz = Tensor::empty({total, dz.dim(1)});
        layer.ones = Tensor::full({1, total}, 1.0f);
      }
    }
    layer.x.slice(first, first + rows).copy_from(x);
    layer.dz.slice(first, first + rows).copy_from(dz);
    try {
      owner_.layer_barrier_.arrive_and_wait(replica_);
    } catch (const Timeout&) {
      rethrow_with_context(std::current_exception(), "the gradients of '" + owner_.vars_[layer.kernel]->name() + "'");
    }
    owner_.compute_block(replica_, layer);
    dw = owner_.gradients_[layer.kernel];
    if (layer.bias != DenseVariables::kNone) db = owner_.gradients_[layer.bias];
  }

 private:
  DenseTogether& owner_;
  int replica_;
};

DenseTogether::DenseTogether(int replicas, std::span<Variable* const> vars, std::span<const DenseVariables> layers,
                             std::chrono::milliseconds timeout)
    : cores_(available_cores()), vars_(vars.begin(), vars.end()), gradients_(vars.size()),
      part_(static_cast<std::size_t>(replicas), -1), with_rows_(static_cast<std::size_t>(replicas)), layer_barrier_(replicas, comm::kSpinPauses, timeout, "dense layer barrier"),
      finish_barrier_(replicas, spins_for(replicas), timeout, "step barrier (the end of backward)") {
  for (const DenseVariables& d : layers) {
    Layer& l = layers_.emplace_back();
    l.kernel = d.kernel;
    l.bias = d.bias;
    l.step_used.assign(static_cast<std::size_t>(replicas), 0);
    l.group_done.assign(static_cast<std::size_t>(replicas), 0);
    for (const std::size_t k : {d.kernel, d.bias})
      if (k != DenseVariables::kNone) gradients_[k] = Tensor::zeros(vars[k]->shape());
    // The bias gradient as the [1, out] product it is computed as.
    if (d.bias != DenseVariables::kNone) l.bias_row = gradients_[d.bias].reshape({1, vars[d.bias]->numel()});
  }
  for (int r = 0; r < replicas; ++r) hooks_.push_back(std::make_unique<Hook>(*this, r));
}

DenseGradientsTogether* DenseTogether::replica(int r) { return hooks_[static_cast<std::size_t>(r)].get(); }

void DenseTogether::begin_step(std::span<const std::int64_t> row_bounds, bool accumulate) {
  bounds_.assign(row_bounds.begin(), row_bounds.end());
  parts_ = 0;
  for (std::size_t r = 0; r < part_.size(); ++r) {
    with_rows_[r] = bounds_[r + 1] > bounds_[r];
    part_[r] = with_rows_[r] ? parts_++ : -1;
  }
  layer_barrier_.reset(with_rows_, spins_for(parts_));
  accumulate_ = accumulate;
  ++step_;
  if (!accumulate) ++group_;
  // Variables may have been given new storage since the last step (assign, load_weights).
  for (Layer& l : layers_) l.key = vars_[l.kernel]->value().raw_data();
}

DenseTogether::Layer& DenseTogether::layer_of(const Tensor& kernel) {
  for (Layer& l : layers_)
    if (l.key == kernel.raw_data()) return l;
  DTRAIN_THROW(InternalError, "dense gradients together: a kernel of shape ", kernel.shape().to_string(),
               " is not one of the model's dense layers");
}

bool DenseTogether::computed(std::size_t index) const {
  for (const Layer& l : layers_)
    if (l.kernel == index || l.bias == index)
      for (const std::uint64_t g : l.group_done)
        if (g == group_) return true;
  return false;
}

int DenseTogether::spins_for(int threads) const {
  // Spinning takes the core that a late replica needs once replicas outnumber cores.
  return threads <= cores_ ? comm::kSpinPauses : 0;
}

void DenseTogether::compute_block(int r, Layer& layer) {
  layer.group_done[static_cast<std::size_t>(r)] = group_;
  const std::int64_t out = layer.dz.dim(1), p = part_[static_cast<std::size_t>(r)];
  const std::int64_t begin = out * p / parts_, end = out * (p + 1) / parts_;
  if (begin == end) return;
  auto& backend = kernels::backend();
  backend.matmul(layer.x, layer.dz, gradients_[layer.kernel],
                 {.transpose_a = true, .accumulate = accumulate_, .column_begin = begin, .column_end = end});
  if (layer.bias != DenseVariables::kNone)
    backend.matmul(layer.ones, layer.dz, layer.bias_row,
                   {.accumulate = accumulate_, .column_begin = begin, .column_end = end});
}

}  // namespace dtrain::distribute::detail
