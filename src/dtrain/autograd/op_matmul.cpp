// matmul: c[M,N] = op(a)[M,K] · op(b)[K,N]. Backward keeps a and b; transposes are
// expressed through oneDNN strides, never materialised.
#include "dtrain/autograd/op_util.h"

namespace dtrain {

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  detail::check_float(a, "matmul");
  detail::check_float(b, "matmul");
  if (a.rank() != 2 || b.rank() != 2)
    DTRAIN_THROW(InvalidArgument, "matmul: expects 2-D tensors, got ", a.shape().to_string(), " and ",
                 b.shape().to_string());
  const std::int64_t M = transpose_a ? a.dim(1) : a.dim(0);
  const std::int64_t N = transpose_b ? b.dim(0) : b.dim(1);
  Tensor c = detail::empty_on(a, {M, N});
  detail::backend_of(a).matmul(a, b, c, {.transpose_a = transpose_a, .transpose_b = transpose_b});

  detail::record(c, [&] {
    return [a, b, transpose_a, transpose_b](const Tensor& dc, BackwardContext& ctx) {
      auto& be = detail::backend_of(dc);
      if (ctx.needs(0)) {
        // op(a) = a: da = dc · op(b)ᵀ.   op(a) = aᵀ: da = op(b) · dcᵀ.
        Tensor da = detail::empty_on(dc, a.shape());
        if (!transpose_a) be.matmul(dc, b, da, {.transpose_a = false, .transpose_b = !transpose_b});
        else be.matmul(b, dc, da, {.transpose_a = transpose_b, .transpose_b = true});
        ctx.add(0, da);
      }
      if (ctx.needs(1)) {
        // op(b) = b: db = op(a)ᵀ · dc.   op(b) = bᵀ: db = dcᵀ · op(a).
        Tensor db = detail::empty_on(dc, b.shape());
        if (!transpose_b) be.matmul(a, dc, db, {.transpose_a = !transpose_a, .transpose_b = false});
        else be.matmul(dc, a, db, {.transpose_a = true, .transpose_b = transpose_a});
        ctx.add(1, db);
      }
    };
  }, a, b);
  return c;
}

}  // namespace dtrain
