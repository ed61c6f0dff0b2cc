// Batch and layer normalization. Batch normalization runs as two kernel passes each way,
// with the per-channel figures between them computed here (they are [C] vectors):
//   forward:  s = Σx, q = Σx² (channel_sums); mean = s / n, var = q / n - mean²;
//             y = x * a + c with a = gamma / sqrt(var + eps), c = beta - mean * a.
//   backward: S1 = Σdy, S2 = Σdy (x - mean) (channel_sums); dgamma = S2 * inv_std, dbeta = S1;
//             dx = gamma * inv_std * (dy - S1 / n - (x - mean) * inv_std² * S2 / n),
//             one channel_affine pass: dx = dy * a + x * B + K.
// Synchronized, the sums are summed over the replicas between the passes (n too), so every
// replica normalizes by the global batch's statistics; dgamma and dbeta stay the replica's
// own (the strategy sums gradients), while dx needs the global sums.
// On a GPU the [C] figures make a round trip through the host: a wait for the device at
// each batch norm, forward and backward (cuDNN's fused batch norm is to replace it).
#include <cmath>
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

// values summed over every replica, with `count` appended and summed alongside; the call
// is timed for the step's profile.
std::vector<float> sum_over_replicas(CrossReplica& cross, const std::vector<float>& values, double count, bool backward) {
  const auto n = static_cast<std::int64_t>(values.size());
  Tensor packed = Tensor::empty({n + 1});
  std::copy_n(values.data(), n, packed.data<float>());
  packed.data<float>()[n] = static_cast<float>(count);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Tensor> summed = cross.all_reduce_sum(std::span<const Tensor>(&packed, 1));
  const float* p = summed.front().data<float>();
  std::vector<float> out(p, p + packed.numel());
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

// A per-channel parameter's values on the host (`otherwise` for each where it is undefined).
std::vector<float> host_values(const Tensor& t, std::int64_t c, float otherwise) {
  return t.defined() ? t.to_vector() : std::vector<float>(static_cast<std::size_t>(c), otherwise);
}

// [C] values computed on the host, as a tensor on `device`.
Tensor on_device(const std::vector<float>& values, Device device) {
  return Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values).to(device);
}

// gamma's and beta's gradients from the sums [Σdy, Σdy (x - mean)] of channel_sums, into
// inputs `gamma_input` and `gamma_input + 1` where they are needed.
void add_scale_shift_gradients(BackwardContext& ctx, int gamma_input, const std::vector<float>& sums,
                               const std::vector<float>& inv_std, std::int64_t c, Device device) {
  if (ctx.needs(gamma_input)) {
    std::vector<float> dgamma(static_cast<std::size_t>(c));
    for (std::size_t j = 0; j < dgamma.size(); ++j) dgamma[j] = sums[dgamma.size() + j] * inv_std[j];
    ctx.add(gamma_input, on_device(dgamma, device));
  }
  if (ctx.needs(gamma_input + 1))
    ctx.add(gamma_input + 1, on_device(std::vector<float>(sums.begin(), sums.begin() + c), device));
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
  const Device device = x.device();
  const Tensor zeros = Tensor::zeros({c}, DType::f32, device);
  Tensor sums = detail::empty_on(x, {2, c});
  be.channel_sums(x, x, zeros, sums);
  CrossReplica* cross = synchronizing(synchronized);
  std::vector<float> total = sums.to_vector();
  double n = static_cast<double>(rows);
  if (cross) {
    total = sum_over_replicas(*cross, total, n, false);
    n = total.back();
  }
  if (n <= 0.0)
    DTRAIN_THROW(InvalidArgument, "batch_norm: the batch ", x.shape().to_string(), " has no rows to take statistics of");
  const std::vector<float> g = host_values(gamma, c, 1.0f), bt = host_values(beta, c, 0.0f);
  const auto cs = static_cast<std::size_t>(c);
  std::vector<float> mean_h(cs), variance_h(cs), inv_std_h(cs), scale_h(cs), shift_h(cs);
  for (std::size_t j = 0; j < cs; ++j) {
    const double m = total[j] / n;
    const double v = std::max(0.0, total[cs + j] / n - m * m);
    const double s = 1.0 / std::sqrt(v + static_cast<double>(epsilon));
    mean_h[j] = static_cast<float>(m);
    variance_h[j] = static_cast<float>(v);
    inv_std_h[j] = static_cast<float>(s);
    scale_h[j] = static_cast<float>(g[j] * s);
    shift_h[j] = static_cast<float>(bt[j] - m * g[j] * s);
  }
  const Tensor mean = on_device(mean_h, device), scale = on_device(scale_h, device);
  Tensor y = detail::empty_on(x, x.shape());
  be.channel_affine(x, scale, on_device(shift_h, device), y, nullptr, nullptr, relu);
  if (batch_mean) *batch_mean = mean;
  if (batch_variance) *batch_variance = on_device(variance_h, device);
  detail::record(y, [&] {
    return [x, y, mean, mean_h, inv_std_h, scale, scale_h, n, c, synchronized, relu](const Tensor& relu_dy,
                                                                                     BackwardContext& ctx) {
      auto& b = detail::backend_of(relu_dy);
      const Device at = relu_dy.device();
      // A fused relu's derivative first: the gradient of the batch norm's own output.
      Tensor dy = relu_dy;
      if (relu) {
        dy = detail::empty_on(relu_dy, y.shape());
        b.unary_backward(kernels::Unary::relu, y, relu_dy, dy);
      }
      Tensor dsums = detail::empty_on(relu_dy, {2, c});
      b.channel_sums(dy, x, mean, dsums);
      const std::vector<float> s = dsums.to_vector();
      add_scale_shift_gradients(ctx, 1, s, inv_std_h, c, at);
      // Every replica joins the sums, whatever it needs: they all run the same graph.
      CrossReplica* others = synchronizing(synchronized);
      std::vector<float> dtotal = s;
      if (others) dtotal = sum_over_replicas(*others, s, 0.0, true);
      if (!ctx.needs(0)) return;
      const auto channels = static_cast<std::size_t>(c);
      std::vector<float> k(channels), bx(channels);
      for (std::size_t j = 0; j < channels; ++j) {
        const double a = scale_h[j], is = inv_std_h[j], m = mean_h[j];
        const double s1 = dtotal[j], s2 = dtotal[channels + j];
        const double bj = -a * is * is * s2 / n;
        bx[j] = static_cast<float>(bj);
        k[j] = static_cast<float>(-a * s1 / n - bj * m);
      }
      Tensor dx = detail::empty_on(relu_dy, x.shape());
      const Tensor bx_d = on_device(bx, at);
      b.channel_affine(dy, scale, on_device(k, at), dx, &x, &bx_d);
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
  const Device device = x.device();
  const auto cs = static_cast<std::size_t>(c);
  const std::vector<float> variance_h = variance.to_vector(), mean_h = mean.to_vector();
  const std::vector<float> g = host_values(gamma, c, 1.0f), bt = host_values(beta, c, 0.0f);
  std::vector<float> inv_std_h(cs), scale_h(cs), shift_h(cs);
  for (std::size_t j = 0; j < cs; ++j) {
    const double s = 1.0 / std::sqrt(static_cast<double>(variance_h[j]) + static_cast<double>(epsilon));
    inv_std_h[j] = static_cast<float>(s);
    scale_h[j] = static_cast<float>(g[j] * s);
    shift_h[j] = static_cast<float>(bt[j] - mean_h[j] * g[j] * s);
  }
  auto& be = detail::backend_of(x);
  const Tensor scale = on_device(scale_h, device);
  Tensor y = detail::empty_on(x, x.shape());
  be.channel_affine(x, scale, on_device(shift_h, device), y, nullptr, nullptr, relu);
  const Tensor m = mean.clone();  // the moving statistics change after this step
  detail::record(y, [&] {
    return [x, y, m, inv_std_h, scale, c, relu](const Tensor& relu_dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(relu_dy);
      Tensor dy = relu_dy;
      if (relu) {
        dy = detail::empty_on(relu_dy, y.shape());
        b.unary_backward(kernels::Unary::relu, y, relu_dy, dy);
      }
      if (ctx.needs(3) || ctx.needs(4)) {
        Tensor sums = detail::empty_on(relu_dy, {2, c});
        b.channel_sums(dy, x, m, sums);
        add_scale_shift_gradients(ctx, 3, sums.to_vector(), inv_std_h, c, relu_dy.device());
      }
      if (ctx.needs(0)) {
        Tensor dx = detail::empty_on(relu_dy, dy.shape());
        b.channel_affine(dy, scale, Tensor::zeros({c}, DType::f32, relu_dy.device()), dx);
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
