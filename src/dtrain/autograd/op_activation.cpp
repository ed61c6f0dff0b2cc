// Unary functions and softmax. Each backward reads what makes its derivative exact and
// cheap: the output for relu, sigmoid, tanh, exp, sqrt and softmax; the input otherwise.
#include "dtrain/autograd/op_util.h"

namespace dtrain {
namespace {

using kernels::Unary;

bool saves_output(Unary op) {
  return op == Unary::relu || op == Unary::sigmoid || op == Unary::tanh || op == Unary::exp || op == Unary::sqrt;
}

Tensor unary_op(Unary op, const Tensor& x, const char* name, float alpha = 1.0f, float beta = 0.0f) {
  detail::check_float(x, name);
  Tensor y = detail::empty_on(x, x.shape());
  detail::backend_of(x).unary(op, x, y, alpha, beta);
  detail::record(y, [&] {
    return [op, saved = saves_output(op) ? y : x, alpha, beta](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, dy.shape());
      detail::backend_of(dy).unary_backward(op, saved, dy, dx, alpha, beta);
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

Tensor softmax_op(const Tensor& x, bool log) {
  detail::check_float(x, log ? "log_softmax" : "softmax");
  Tensor y = detail::empty_on(x, x.shape());
  detail::backend_of(x).softmax(x, y, log);
  detail::record(y, [&] {
    return [y, log](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, dy.shape());
      detail::backend_of(dy).softmax_backward(y, dy, dx, log);
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

}  // namespace

Tensor relu(const Tensor& x) { return unary_op(Unary::relu, x, "relu"); }
Tensor sigmoid(const Tensor& x) { return unary_op(Unary::sigmoid, x, "sigmoid"); }
Tensor tanh(const Tensor& x) { return unary_op(Unary::tanh, x, "tanh"); }
Tensor gelu(const Tensor& x) { return unary_op(Unary::gelu, x, "gelu"); }
Tensor gelu(const Tensor& x, bool approximate) {
  return approximate ? unary_op(Unary::gelu_tanh, x, "gelu") : gelu(x);
}
Tensor exp(const Tensor& x) { return unary_op(Unary::exp, x, "exp"); }
Tensor log(const Tensor& x) { return unary_op(Unary::log, x, "log"); }
Tensor square(const Tensor& x) { return unary_op(Unary::square, x, "square"); }
Tensor sqrt(const Tensor& x) { return unary_op(Unary::sqrt, x, "sqrt"); }
Tensor abs(const Tensor& x) { return unary_op(Unary::abs, x, "abs"); }

Tensor clip_by_value(const Tensor& x, float lo, float hi) {
  if (!(lo <= hi)) DTRAIN_THROW(InvalidArgument, "clip_by_value: lower bound ", lo, " exceeds upper bound ", hi);
  return unary_op(Unary::clip, x, "clip_by_value", lo, hi);
}

Tensor softmax(const Tensor& x) { return softmax_op(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_op(x, true); }

void check_activation_name(std::string_view name) {
  static constexpr std::string_view known[] = {"", "linear", "relu", "sigmoid", "tanh", "softmax", "gelu"};
  for (auto k : known)
    if (k == name) return;
  DTRAIN_THROW(InvalidArgument, "unknown activation '", name,
               "'; expected one of linear, relu, sigmoid, tanh, softmax, gelu");
}

Tensor activation(const Tensor& x, std::string_view name) {
  if (name.empty() || name == "linear") return x;
  if (name == "relu") return relu(x);
  if (name == "sigmoid") return sigmoid(x);
  if (name == "tanh") return tanh(x);
  if (name == "softmax") return softmax(x);
  if (name == "gelu") return gelu(x);
  check_activation_name(name);
  return x;
}

}  // namespace dtrain
