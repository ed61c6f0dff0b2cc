// Replicas that share one copy of a dense layer's weights can compute its weight gradient
// together rather than each its own and then summing them: every replica hands over its
// rows of the layer's input x and of the gradient dz at its output, and each computes a
// block of the gradient's columns, dW[:, cols] = Xᵀ · dZ[:, cols], over every replica's
// rows. The sum over replicas is then the product's inner sum, and no replica writes or
// reads a whole gradient of its own.
//
// A strategy sets one on each replica thread for a training step; dense's backward asks
// the calling thread's. Every replica must then call gradients() for the same layers in
// the same order, since each call waits for the others' rows.
#pragma once

#include "dtrain/core/scoped.h"
#include "dtrain/core/tensor.h"

namespace dtrain {

class DenseGradientsTogether {
 public:
  virtual ~DenseGradientsTogether() = default;
  // Whether the gradient of `kernel` (a variable's value) is computed together this step.
  virtual bool takes(const Tensor& kernel) const = 0;
  // This replica's rows x [rows, in] and dz [rows, out] of the layer with `kernel`. Sets
  // dw [in, out] to the gradient over every replica's rows, and db [out] too when the
  // layer's bias is computed together (otherwise db stays undefined: the caller's own).
  virtual void gradients(const Tensor& kernel, const Tensor& x, const Tensor& dz, Tensor& dw, Tensor& db) = 0;
};

// The calling thread's, or null.
DenseGradientsTogether* dense_gradients_together();

// Sets the calling thread's while the guard lives.
class ScopedDenseGradientsTogether : ScopedAssign<DenseGradientsTogether*> {
 public:
  explicit ScopedDenseGradientsTogether(DenseGradientsTogether* together);
};

}  // namespace dtrain
