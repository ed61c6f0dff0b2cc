// The regularizers' penalty from the differentiable ops.
#include "dtrain/nn/regularizers.h"

#include "dtrain/autograd/ops.h"

namespace dtrain::nn {

Regularizer Regularizer::from_name(const std::string& name) {
  if (name == "l1" || name == "L1") return L1();
  if (name == "l2" || name == "L2") return L2();
  if (name == "l1_l2" || name == "L1L2") return L1L2(0.01f, 0.01f);
  DTRAIN_THROW(InvalidArgument, "unknown regularizer '", name, "'; expected l1, l2 or l1_l2");
}

const char* Regularizer::class_name() const {
  switch (kind) {
    case Kind::l1: return "L1";
    case Kind::l2: return "L2";
    case Kind::l1_l2: return "L1L2";
  }
  return "?";
}

Tensor regularization(const Regularizer& r, const Tensor& x) {
  Tensor total;
  if (r.l1 != 0.0f) total = scale(reduce_sum(abs(x)), r.l1);
  if (r.l2 != 0.0f) {
    const Tensor squares = scale(reduce_sum(square(x)), r.l2);
    total = total.defined() ? add(total, squares) : squares;
  }
  return total.defined() ? total : Tensor::scalar(0.0f).to(x.device());
}

}  // namespace dtrain::nn
