// Inverted dropout: y = x ⊙ mask with mask ∈ {0, 1/(1-rate)}; backward dx = dy ⊙ mask.
#include "dtrain/autograd/op_util.h"

namespace dtrain {

Tensor dropout(const Tensor& x, float rate, const Generator& generator) {
  detail::check_float(x, "dropout");
  if (!(rate >= 0.0f && rate < 1.0f)) DTRAIN_THROW(InvalidArgument, "dropout: rate ", rate, " must be in [0, 1)");
  Tensor y = detail::empty_on(x, x.shape());
  Tensor mask = detail::empty_on(x, x.shape());
  detail::backend_of(x).dropout(x, rate, generator, y, mask);
  detail::record(y, [&] {
    return [mask](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, dy.shape());
      detail::backend_of(dy).binary(kernels::Binary::mul, dy, mask, dx);
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

}  // namespace dtrain
