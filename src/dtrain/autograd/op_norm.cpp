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
std::vector<float> sum_over_replicas(CrossReplica& cross, const Tensor& values, double count, bool backward) {
  Tensor packed = Tensor::empty({values.numel() + 1});
  std::copy_n(values.data<float>(), values.numel(), packed.data<float>());
  packed.data<float>()[values.numel()] = static_cast<float>(count);
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

float at(const Tensor& t, std::int64_t i, float otherwise) { return t.defined() ? t.data<float>()[i] : otherwise; }

// gamma's and beta's gradients from the sums [Σdy, Σdy (x - mean)] of channel_sums, into
// inputs `gamma_input` and `gamma_input + 1` where they are needed.
void add_scale_shift_gradients(BackwardContext& ctx, int gamma_input, const float* sums, const Tensor& inv_std,
                               std::int64_t c) {
  if (ctx.needs(gamma_input)) {
    Tensor dgamma = Tensor::empty({c});
    for (std::int64_t j = 0; j < c; ++j) dgamma.data<float>()[j] = sums[c + j] * inv_std.data<float>()[j];
    ctx.add(gamma_input, dgamma);
  }
  if (ctx.needs(gamma_input + 1)) {
    Tensor dbeta = Tensor::empty({c});
    std::copy_n(sums, c, dbeta.data<float>());
    ctx.add(gamma_input + 1, dbeta);
  }
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
  const Tensor zeros = Tensor::zeros({c});
  Tensor sums = Tensor::empty({2, c});
  be.channel_sums(x, x, zeros, sums);
  CrossReplica* cross = synchronizing(synchronized);
  std::vector<float> total(sums.data<float>(), sums.data<float>() + 2 * c);
  double n = static_cast<double>(rows);
  if (cross) {
    total = sum_over_replicas(*cross, sums, n, false);
    n = total.back();
  }
  if (n <= 0.0)
    DTRAIN_THROW(InvalidArgument, "batch_norm: the batch ", x.shape().to_string(), " has no rows to take statistics of");
  Tensor mean = Tensor::empty({c}), variance = Tensor::empty({c}), inv_std = Tensor::empty({c});
  Tensor scale = Tensor::empty({c}), shift = Tensor::empty({c});
  for (std::int64_t j = 0; j < c; ++j) {
    const double m = total[static_cast<std::size_t>(j)] / n;
    const double v = std::max(0.0, total[static_cast<std::size_t>(c + j)] / n - m * m);
    const double s = 1.0 / std::sqrt(v + static_cast<double>(epsilon));
    mean.data<float>()[j] = static_cast<float>(m);
    variance.data<float>()[j] = static_cast<float>(v);
    inv_std.data<float>()[j] = static_cast<float>(s);
    scale.data<float>()[j] = static_cast<float>(at(gamma, j, 1.0f) * s);
    shift.data<float>()[j] = static_cast<float>(at(beta, j, 0.0f) - m * at(gamma, j, 1.0f) * s);
  }
  Tensor y = Tensor::empty(x.shape());
  be.channel_affine(x, scale, shift, y, nullptr, nullptr, relu);
  if (batch_mean) *batch_mean = mean;
  if (batch_variance) *batch_variance = variance;
  detail::record(y, [&] {
    return [x, y, mean, inv_std, scale, n, c, synchronized, relu](const Tensor& relu_dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(relu_dy);
      // A fused relu's derivative first: the gradient of the batch norm's own output.
      Tensor dy = relu_dy;
      if (relu) {
        dy = Tensor::empty(y.shape());
        b.unary_backward(kernels::Unary::relu, y, relu_dy, dy);
      }
      Tensor dsums = Tensor::empty({2, c});
      b.channel_sums(dy, x, mean, dsums);
      const float* s = dsums.data<float>();
      add_scale_shift_gradients(ctx, 1, s, inv_std, c);
      // Every replica joins the sums, whatever it needs: they all run the same graph.
      CrossReplica* others = synchronizing(synchronized);
      std::vector<float> dtotal(s, s + 2 * c);
      if (others) dtotal = sum_over_replicas(*others, dsums, 0.0, true);
      if (!ctx.needs(0)) return;
      Tensor k = Tensor::empty({c}), bx = Tensor::empty({c});
      for (std::int64_t j = 0; j < c; ++j) {
        const double a = scale.data<float>()[j], is = inv_std.data<float>()[j], m = mean.data<float>()[j];
        const double s1 = dtotal[static_cast<std::size_t>(j)], s2 = dtotal[static_cast<std::size_t>(c + j)];
        const double bj = -a * is * is * s2 / n;
        bx.data<float>()[j] = static_cast<float>(bj);
        k.data<float>()[j] = static_cast<float>(-a * s1 / n - bj * m);
      }
      Tensor dx = Tensor::empty(x.shape());
      b.channel_affine(dy, scale, k, dx, &x, &bx);
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
  Tensor inv_std = Tensor::empty({c}), scale = Tensor::empty({c}), shift = Tensor::empty({c});
  for (std::int64_t j = 0; j < c; ++j) {
    const double s = 1.0 / std::sqrt(static_cast<double>(variance.data<float>()[j]) + static_cast<double>(epsilon));
    inv_std.data<float>()[j] = static_cast<float>(s);
    scale.data<float>()[j] = static_cast<float>(at(gamma, j, 1.0f) * s);
    shift.data<float>()[j] = static_cast<float>(at(beta, j, 0.0f) - mean.data<float>()[j] * at(gamma, j, 1.0f) * s);
  }
  auto& be = detail::backend_of(x);
  Tensor y = Tensor::empty(x.shape());
  be.channel_affine(x, scale, shift, y, nullptr, nullptr, relu);
  const Tensor m = mean.clone();  // the moving statistics change after this step
  detail::record(y, [&] {
    return [x, y, m, inv_std, scale, c, relu](const Tensor& relu_dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(relu_dy);
      Tensor dy = relu_dy;
      if (relu) {
        dy = Tensor::empty(y.shape());
        b.unary_backward(kernels::Unary::relu, y, relu_dy, dy);
      }
      if (ctx.needs(3) || ctx.needs(4)) {
        Tensor sums = Tensor::empty({2, c});
        b.channel_sums(dy, x, m, sums);
        add_scale_shift_gradients(ctx, 3, sums.data<float>(), inv_std, c);
      }
      if (ctx.needs(0)) {
        Tensor dx = Tensor::empty(dy.shape());
        b.channel_affine(dy, scale, Tensor::zeros({c}), dx);
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
  Tensor y = Tensor::empty({rows, d}), mean = Tensor::empty({rows}), inv_std = Tensor::empty({rows});
  be.layer_norm(x2, gamma, beta, epsilon, y, mean, inv_std);
  Tensor out = y.reshape(x.shape());
  detail::record(out, [&] {
    return [x2, gamma, mean, inv_std, shape = x.shape(), d](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = Tensor::empty(x2.shape());
      Tensor dgamma = ctx.needs(1) ? Tensor::empty({d}) : Tensor();
      Tensor dbeta = ctx.needs(2) ? Tensor::empty({d}) : Tensor();
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
