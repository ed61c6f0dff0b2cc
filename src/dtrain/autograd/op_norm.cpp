// Batch and layer normalization. Batch normalization runs as two kernel passes each way,
// with the per-channel figures between them (kernels' batch_norm_coefficients, [C] vectors
// computed where the tensors are, so a GPU runs it without waiting):
//   forward:  s = Σx, q = Σx² (channel_sums); mean = s / n, var = q / n - mean²;
//             y = x * a + c with a = gamma / sqrt(var + eps), c = beta - mean * a.
//   backward: S1 = Σdy, S2 = Σdy (x - mean) (channel_sums); dgamma = S2 * inv_std, dbeta = S1;
//             dx = gamma * inv_std * (dy - S1 / n - (x - mean) * inv_std² * S2 / n),
//             one channel_affine pass: dx = dy * a + x * B + K.
// Synchronized, the sums are summed over the replicas between the passes (n too), so every
// replica normalizes by the global batch's statistics; dgamma and dbeta stay the replica's
// own (the strategy sums gradients), while dx needs the global sums.
#include <chrono>
#include <span>
#include <vector>

#include "dtrain/autograd/op_util.h"
#include "dtrain/core/replica.h"

namespace dtrain {
namespace {

// The replica context's cross-replica calls when a synchronized op must use them.
CrossReplica* synchronizing(bool synchronized) {
  const ReplicaContext& context = replica_context();
  return synchronized && context.cross != nullptr && context.num_replicas_in_sync > 1 ? context.cross : nullptr;
}

// sums [2, C] summed over every replica, back on their device; `count` is summed alongside
// (the rows of all). The call is timed for the step's profile.
Tensor sum_over_replicas(CrossReplica& cross, const Tensor& sums, double& count, bool backward) {
  const auto start = std::chrono::steady_clock::now();
  Tensor out;
  if (sums.device().is_cpu()) {
    // One tensor, the count after the sums: one collective between workers.
    std::vector<float> values = sums.to_vector();
    const auto n = static_cast<std::int64_t>(values.size());
    values.push_back(static_cast<float>(count));
    const Tensor packed = Tensor::from_vector({n + 1}, values);
    const Tensor summed = cross.all_reduce_sum(std::span<const Tensor>(&packed, 1)).front();
    count = summed.data<float>()[n];
    out = summed.slice(0, n).reshape(sums.shape());
  } else {
    // A GPU's sums stay there (logical GPUs of one GPU add them on it); the count is the host's.
    const Tensor both[2] = {sums, Tensor::from_vector({1}, {static_cast<float>(count)})};
    const std::vector<Tensor> summed = cross.all_reduce_sum(std::span<const Tensor>(both, 2));
    count = summed[1].to_vector().front();
    out = summed[0];
  }
  timed_cross_replica_calls().push_back({start, std::chrono::steady_clock::now(), backward,
                                         backward ? "sync batch norm (gradient sums)" : "sync batch norm (statistics)"});
  return out;
}

void check_channel_param(const Tensor& p, std::int64_t c, const char* op, const char* what) {
  if (!p.defined()) return;
  detail::check_float(p, op);
  if (!(p.shape() == Shape{c}))
    DTRAIN_THROW(InvalidArgument, op, ": ", what, " is ", p.shape().to_string(), ", expected [", c,
                 "] (the input's last axis)");
}

// Rows of batch_norm_coefficients's [5, C] and of its gradient's [4, C].
enum Figure : std::int64_t { kMean, kVariance, kInvStd, kScale, kShift };
enum GradientFigure : std::int64_t { kDgamma, kDbeta, kBx, kK };

// A fused relu's derivative first: the gradient of the batch norm's own output y.
Tensor before_relu(const Tensor& y, const Tensor& relu_dy, bool relu) {
  if (!relu) return relu_dy;
  Tensor dy = detail::empty_on(relu_dy, y.shape());
  detail::backend_of(relu_dy).unary_backward(kernels::Unary::relu, y, relu_dy, dy);
  return dy;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, bool synchronized,
                  Tensor* batch_mean, Tensor* batch_variance, bool relu) {
  detail::check_float(x, "batch_norm");
  if (x.rank() < 2)
    DTRAIN_THROW(InvalidArgument, "batch_norm: expects [batch, ..., channels], got ", x.shape().to_string());
  const std::int64_t c = x.dim(-1), rows = c == 0 ? 0 : x.numel() / c;
  check_channel_param(gamma, c, "batch_norm", "gamma");
  check_channel_param(beta, c, "batch_norm", "beta");
  auto& be = detail::backend_of(x);
  const Shape channel{c};
  Tensor sums = detail::empty_on(x, {2, c});
  be.channel_sums(x, x, Tensor::zeros(channel, DType::f32, x.device()), sums);
  double n = static_cast<double>(rows);
  if (CrossReplica* cross = synchronizing(synchronized)) sums = sum_over_replicas(*cross, sums, n, false);
  if (n <= 0.0)
    DTRAIN_THROW(InvalidArgument, "batch_norm: the batch ", x.shape().to_string(), " has no rows to take statistics of");
  Tensor figures = detail::empty_on(x, {5, c});
  be.batch_norm_coefficients(sums.row(0, channel), sums.row(1, channel), n, gamma, beta, epsilon, figures);
  Tensor y = detail::empty_on(x, x.shape());
  be.channel_affine(x, figures.row(kScale, channel), figures.row(kShift, channel), y, nullptr, nullptr, relu);
  if (batch_mean) *batch_mean = figures.row(kMean, channel);
  if (batch_variance) *batch_variance = figures.row(kVariance, channel);
  detail::record(y, [&] {
    return [x, y, figures, n, channel, synchronized, relu](const Tensor& relu_dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(relu_dy);
      const Tensor dy = before_relu(y, relu_dy, relu);
      Tensor dsums = detail::empty_on(relu_dy, {2, channel[0]});
      b.channel_sums(dy, x, figures.row(kMean, channel), dsums);
      // Every replica joins the sums, whatever it needs: they all run the same graph.
      Tensor total = dsums;
      double count = 0.0;
      if (CrossReplica* others = synchronizing(synchronized)) total = sum_over_replicas(*others, dsums, count, true);
      Tensor gradients = detail::empty_on(relu_dy, {4, channel[0]});
      b.batch_norm_gradient_coefficients(dsums, total, n, figures, gradients);
      if (ctx.needs(1)) ctx.add(1, gradients.row(kDgamma, channel));
      if (ctx.needs(2)) ctx.add(2, gradients.row(kDbeta, channel));
      if (!ctx.needs(0)) return;
      Tensor dx = detail::empty_on(relu_dy, x.shape());
      const Tensor bx = gradients.row(kBx, channel);
      b.channel_affine(dy, figures.row(kScale, channel), gradients.row(kK, channel), dx, &x, &bx);
      ctx.add(0, dx);
    };
  }, x, gamma, beta);
  return y;
}

Tensor batch_norm_inference(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma,
                            const Tensor& beta, float epsilon, bool relu) {
  detail::check_float(x, "batch_norm_inference");
  if (x.rank() < 1) DTRAIN_THROW(InvalidArgument, "batch_norm_inference: expects [..., channels], got a scalar");
  const std::int64_t c = x.dim(-1);
  check_channel_param(mean, c, "batch_norm_inference", "mean");
  check_channel_param(variance, c, "batch_norm_inference", "variance");
  check_channel_param(gamma, c, "batch_norm_inference", "gamma");
  check_channel_param(beta, c, "batch_norm_inference", "beta");
  if (!mean.defined() || !variance.defined())
    DTRAIN_THROW(InvalidArgument, "batch_norm_inference: needs the mean and the variance");
  auto& be = detail::backend_of(x);
  const Shape channel{c};
  // The figures keep their own copy of the mean: the moving statistics change after this step.
  Tensor figures = detail::empty_on(x, {5, c});
  be.batch_norm_coefficients(mean, variance, 0.0, gamma, beta, epsilon, figures);
  Tensor y = detail::empty_on(x, x.shape());
  be.channel_affine(x, figures.row(kScale, channel), figures.row(kShift, channel), y, nullptr, nullptr, relu);
  detail::record(y, [&] {
    return [x, y, figures, channel, relu](const Tensor& relu_dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(relu_dy);
      const Tensor dy = before_relu(y, relu_dy, relu);
      if (ctx.needs(3) || ctx.needs(4)) {
        Tensor sums = detail::empty_on(relu_dy, {2, channel[0]});
        b.channel_sums(dy, x, figures.row(kMean, channel), sums);
        if (ctx.needs(3)) {
          Tensor dgamma = detail::empty_on(relu_dy, channel);
          b.binary(kernels::Binary::mul, sums.row(1, channel), figures.row(kInvStd, channel), dgamma);
          ctx.add(3, dgamma);
        }
        if (ctx.needs(4)) ctx.add(4, sums.row(0, channel));
      }
      if (ctx.needs(0)) {
        Tensor dx = detail::empty_on(relu_dy, dy.shape());
        b.channel_affine(dy, figures.row(kScale, channel), Tensor::zeros(channel, DType::f32, relu_dy.device()), dx);
        ctx.add(0, dx);
      }
    };
  }, x, mean, variance, gamma, beta);
  return y;
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon) {
  detail::check_float(x, "layer_norm");
  if (x.rank() < 1) DTRAIN_THROW(InvalidArgument, "layer_norm: expects [..., features], got a scalar");
  const std::int64_t d = x.dim(-1), rows = d == 0 ? 0 : x.numel() / d;
  check_channel_param(gamma, d, "layer_norm", "gamma");
  check_channel_param(beta, d, "layer_norm", "beta");
  auto& be = detail::backend_of(x);
  const Tensor x2 = x.reshape({rows, d});
  Tensor y = detail::empty_on(x, {rows, d}), mean = detail::empty_on(x, {rows}), inv_std = detail::empty_on(x, {rows});
  be.layer_norm(x2, gamma, beta, epsilon, y, mean, inv_std);
  Tensor out = y.reshape(x.shape());
  detail::record(out, [&] {
    return [x2, gamma, mean, inv_std, shape = x.shape(), d](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, x2.shape());
      Tensor dgamma = ctx.needs(1) ? detail::empty_on(dy, {d}) : Tensor();
      Tensor dbeta = ctx.needs(2) ? detail::empty_on(dy, {d}) : Tensor();
      detail::backend_of(dy).layer_norm_backward(x2, dy.reshape(x2.shape()), gamma, mean, inv_std, dx,
                                                 ctx.needs(1) ? &dgamma : nullptr, ctx.needs(2) ? &dbeta : nullptr);
      if (ctx.needs(0)) ctx.add(0, dx.reshape(shape));
      if (ctx.needs(1)) ctx.add(1, dgamma);
      if (ctx.needs(2)) ctx.add(2, dbeta);
    };
  }, x, gamma, beta);
  return out;
}

}  // namespace dtrain
