// The CPU backend: oneDNN for matmul, element-wise, binary, reduction, softmax and
// reorders (primitives built once per shape and cached), plain OpenMP loops for what
// oneDNN has no primitive for (fused losses, dropout, optimizer updates, argmax).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "dtrain/kernels/backend.h"

namespace dtrain::kernels {

struct PrimitiveCacheStats {
  std::uint64_t created = 0;  // primitives built (a miss)
  std::uint64_t hits = 0;     // executions that found their primitive cached
};

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  Device device() const override { return Device{}; }
  bool supports(Primitive op, DType dtype) const override;

  void matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& options) override;
  void unary(Unary op, const Tensor& x, Tensor& y, float alpha, float beta) override;
  void unary_backward(Unary op, const Tensor& saved, const Tensor& dy, Tensor& dx, float alpha,
                      float beta) override;
  void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& c) override;
  void reduce(Reduce op, const Tensor& x, Tensor& y) override;
  void softmax(const Tensor& x, Tensor& y, bool log) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) override;
  void convert(const Tensor& x, Tensor& y) override;
  void fill(Tensor& y, float value) override;
  void axpby(float alpha, const Tensor& x, float beta, Tensor& y) override;
  double sum_squares(const Tensor& x) override;
  bool all_finite(std::span<const Tensor* const> tensors) override;
  void softmax_cross_entropy(const Tensor& logits, const Tensor& target, Tensor& loss,
                             Tensor& log_probs) override;
  void softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target,
                                      const Tensor& dloss, Tensor& dlogits) override;
  void dropout(const Tensor& x, float rate, const Generator& generator, Tensor& y,
               Tensor& mask) override;
  void argmax(const Tensor& x, Tensor& out) override;
  void one_hot(const Tensor& labels, Tensor& out) override;
  bool sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const SgdUpdate& p) override;
  bool adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& p) override;
  bool rmsprop_update(Tensor& w, const Tensor& g, Tensor& v, Tensor* momentum, Tensor* average,
                      const RmspropUpdate& p) override;
  void conv2d(const Tensor& x, const Tensor& kernel, Tensor& y, const Conv2dOptions& options) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& kernel, Tensor& dx, const Conv2dOptions& options) override;
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dkernel, Tensor* dbias,
                               const Conv2dOptions& options) override;
  std::size_t pool2d_workspace_bytes(const Shape& x, const Pool2dOptions& options) override;
  void pool2d(const Tensor& x, Tensor& y, Tensor* workspace, const Pool2dOptions& options) override;
  void pool2d_backward(const Tensor& dy, const Tensor* workspace, Tensor& dx, const Pool2dOptions& options) override;
  void channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, Tensor& sums) override;
  void channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, Tensor& y, const Tensor* x2,
                      const Tensor* scale2, bool relu) override;
  void batch_norm_coefficients(const Tensor& mean, const Tensor& variance, double count, const Tensor& gamma,
                               const Tensor& beta, float epsilon, Tensor& coefficients) override;
  void batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                        const Tensor& coefficients, Tensor& gradients) override;
  void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                  Tensor& inv_std) override;
  void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                           const Tensor& inv_std, Tensor& dx, Tensor* dgamma, Tensor* dbeta) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
                 Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, const AttentionOptions& options, Tensor& dq, Tensor& dk,
                          Tensor& dv) override;
  void gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void scatter_add_rows(const Tensor& ids, const Tensor& rows, Tensor& table) override;
  void copy_block(const Tensor& src, const Block& from, Tensor& dst, const Block& to, std::int64_t outer,
                  std::int64_t rows, std::int64_t width) override;

  PrimitiveCacheStats cache_stats() const;
  // The most bytes of matmul's `a` one oneDNN call takes (its kernels' offsets are 32-bit);
  // a larger one is multiplied in parts. Tests lower it to check the parts.
  void set_matmul_part_bytes(std::int64_t bytes) { matmul_part_bytes_ = bytes; }

 private:
  std::int64_t matmul_part_bytes_ = std::numeric_limits<std::int32_t>::max();
  struct OneDnn;  // engine and primitive cache; defined in cpu_onednn.cpp
  std::unique_ptr<OneDnn> dnn_;

  // Loop fallback for broadcasts oneDNN's binary cannot express (a broadcast first operand).
  void binary_loops(Binary op, const Tensor& a, const Tensor& b, Tensor& c);
  // Reductions over only leading axes (column sums, e.g. a bias gradient) or only trailing
  // axes (row sums); returns false for other layouts. dims_x and dims_y have equal rank.
  bool reduce_contiguous(Reduce op, const Tensor& x, const std::vector<std::int64_t>& dims_x,
                         const std::vector<std::int64_t>& dims_y, Tensor& y);
  // float32 <-> bfloat16 (x and y of those dtypes, one each), rounding to nearest even.
  void convert_loops(const Tensor& x, Tensor& y);
  // A float32 copy of bfloat16 t (convolutions where oneDNN has none in bfloat16).
  Tensor widened(const Tensor& t);
  // y = alpha * x + beta from uint8 x, in one pass (unary linear on bytes).
  void linear_from_bytes(const Tensor& x, float alpha, float beta, Tensor& y);
};

CpuBackend& cpu_backend();

// The register tiles of the CPU's attention: chosen from the CPU (automatic: four rows by
// 16 columns where it has AVX2 and FMA but not AVX-512, else by 64), or set, as tests set
// them to run both. False, changing nothing, where the CPU cannot run the narrow ones.
enum class AttentionTiles { automatic, wide, narrow };
bool set_attention_tiles(AttentionTiles tiles);

}  // namespace dtrain::kernels
