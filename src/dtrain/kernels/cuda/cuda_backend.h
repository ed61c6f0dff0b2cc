// The CUDA backend: matrix products through cuBLASLt (float32 exact unless TF32 is asked
// for; bfloat16 on tensor cores, accumulated in float32), convolutions through cuDNN
// (cuda_conv.cpp), dtrain's own kernels (launch.h) for everything element-wise, row-wise,
// reduced and pooled, all queued on the device's compute stream. Only built with DTRAIN_CUDA.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "dtrain/kernels/backend.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cuda/launch.h"

namespace dtrain::kernels {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index);
  ~CudaBackend() override;

  Device device() const override { return Device::cuda(index_); }
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
  bool begin_finite_check(std::span<const Tensor* const> tensors) override;
  bool finite_check_passed() override;
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
  bool take_deferred_non_finite() override;
  void synchronize() override;
  void trace_kernels(bool on) override;
  void take_kernel_spans(const DeviceEvent& since, std::vector<KernelSpan>& out) override;
  std::size_t kernel_marks() override;
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
  bool sgd_update_many(std::span<const UpdateItem> items, const SgdUpdate& p) override;
  bool adam_update_many(std::span<const UpdateItem> items, const AdamUpdate& p) override;
  bool rmsprop_update_many(std::span<const UpdateItem> items, const RmspropUpdate& p) override;
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

  struct Dnn;  // cuDNN's handle and the convolutions' descriptors and algorithms (cuda_conv.cpp)

 private:
  // The stream and sizes kernels are launched with; first reports a data fault that an
  // earlier kernel found (a label out of range) as an InvalidArgument.
  cuda::Launch launch();
  void report_faults();
  // Device scratch of `bytes`, from the device's cache (returned when the tensor goes).
  Tensor scratch(std::size_t bytes);
  // A cuBLASLt or cuDNN call (static text) was queued: its end, while kernels are timed.
  void library_call_ended(const char* call);
  Dnn& dnn();
  // Throws NotCapturable naming `op` while the calling thread captures a graph: the op's
  // seed is drawn on the host at each call.
  void refuse_host_seed_while_capturing(const char* op) const;
  // x with zeros around it where a convolution pads unevenly (cuDNN pads evenly only).
  Tensor padded_input(const Tensor& x, const ConvDims& d, const Conv2dOptions& o);
  // Keras's kernel [KH, KW, C / groups, F] transposed to cuDNN's [F, KH, KW, C / groups].
  Tensor filters_of(const Tensor& kernel, const ConvDims& d);

  int index_;
  cuda::Launch launch_;
  // Host-mapped flags the kernels write: the updates' non-finite flag and a data fault.
  struct Flags {
    int non_finite;
    int gradient_non_finite;  // all_finite's answer
    int check_non_finite;     // begin_finite_check's, copied from check_flag_
    cuda::DataFault fault;
  };
  Flags* flags_ = nullptr;        // host's view
  Flags* device_flags_ = nullptr; // the kernels' view of the same memory
  struct Blas;                    // cuBLASLt handle, workspace and chosen algorithms
  std::unique_ptr<Blas> blas_;
  std::mutex finite_mutex_;  // all_finite's flag, one caller at a time
  // begin_finite_check's: the answer in device memory, which the updates read (a host-mapped
  // read from every thread would cross the bus), the point after its copy to flags_, and
  // what the updates get as ManyTensors::skip (null: no check under way).
  Tensor check_flag_;
  DeviceEvent check_copied_;
  const int* skip_ = nullptr;
  std::mutex timeline_mutex_;
  std::unique_ptr<KernelTimeline> timeline_;      // made when the trace first times kernels
  std::atomic<KernelTimeline*> timing_{nullptr};  // timeline_ while kernels are timed, else null
  struct DnnDeleter {
    void operator()(Dnn* d) const;
  };
  std::once_flag dnn_made_;
  std::unique_ptr<Dnn, DnnDeleter> dnn_;
};

namespace cuda {
// The element-wise function of a fused activation.
math::UnaryOp activation_op(Activation a);
}  // namespace cuda

// The backend of cuda:index (made on first use; the device must exist).
CudaBackend& cuda_backend(int index);

}  // namespace dtrain::kernels
