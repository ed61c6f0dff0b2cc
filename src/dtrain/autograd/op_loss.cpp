// Cross-entropy from logits, fused and numerically stable: log-softmax by the max-shifted
// log-sum-exp, the per-example loss in the same pass; backward reads the kept log-probs.
#include "dtrain/autograd/op_util.h"

namespace dtrain {

Tensor softmax_cross_entropy_with_logits(const Tensor& target, const Tensor& logits) {
  detail::check_float(logits, "softmax_cross_entropy_with_logits");
  target.check_defined("softmax_cross_entropy_with_logits (target)");
  if (logits.rank() != 2)
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy_with_logits: logits must be [batch, classes], got ",
                 logits.shape().to_string());
  Tensor loss = detail::empty_on(logits, {logits.dim(0)});
  Tensor log_probs = detail::empty_on(logits, logits.shape());
  detail::backend_of(logits).softmax_cross_entropy(logits, target, loss, log_probs);
  detail::record(loss, [&] {
    return [target, log_probs](const Tensor& dloss, BackwardContext& ctx) {
      Tensor dlogits = detail::empty_on(dloss, log_probs.shape());
      detail::backend_of(dloss).softmax_cross_entropy_backward(log_probs, target, dloss, dlogits);
      ctx.add(1, dlogits);
    };
  }, target, logits);
  return loss;
}

Tensor one_hot(const Tensor& labels, std::int64_t classes) {
  labels.check_dtype(DType::i32, "one_hot");
  if (labels.rank() != 1)
    DTRAIN_THROW(InvalidArgument, "one_hot: labels must be [batch], got ", labels.shape().to_string());
  Tensor out = detail::empty_on(labels, {labels.dim(0), classes});
  detail::backend_of(labels).one_hot(labels, out);
  return out;
}

}  // namespace dtrain
