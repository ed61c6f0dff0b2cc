// dlopen and dlsym behind the tables of libraries.h.
#include "dtrain/kernels/cuda/libraries.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::kernels::cuda {
namespace {

void* open_library(const char* name, const char* what) {
  dlerror();
  void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    DTRAIN_THROW(Unsupported, what, " needs ", name, ", which could not be loaded: ", why ? why : "no reason given",
                 " (install it, or add its folder to LD_LIBRARY_PATH)");
  }
  return handle;
}

template <typename F>
void bind(void* handle, const char* library, const char* symbol, F& out) {
  dlerror();
  void* p = dlsym(handle, symbol);
  if (p == nullptr)
    DTRAIN_THROW(Unsupported, library, " has no ", symbol, " (a version dtrain was not built against?)");
  out = reinterpret_cast<F>(p);
}

}  // namespace

const CublasLt& cublaslt() {
  static CublasLt table;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    constexpr const char* lib = "libcublasLt.so.13";
    try {
      void* h = open_library(lib, "a matrix product on the GPU (cuBLASLt)");
      bind(h, lib, "cublasLtCreate", table.create);
      bind(h, lib, "cublasLtDestroy", table.destroy);
      bind(h, lib, "cublasLtGetStatusString", table.status_string);
      bind(h, lib, "cublasLtMatmulDescCreate", table.desc_create);
      bind(h, lib, "cublasLtMatmulDescDestroy", table.desc_destroy);
      bind(h, lib, "cublasLtMatmulDescSetAttribute", table.desc_set);
      bind(h, lib, "cublasLtMatrixLayoutCreate", table.layout_create);
      bind(h, lib, "cublasLtMatrixLayoutDestroy", table.layout_destroy);
      bind(h, lib, "cublasLtMatmulPreferenceCreate", table.preference_create);
      bind(h, lib, "cublasLtMatmulPreferenceDestroy", table.preference_destroy);
      bind(h, lib, "cublasLtMatmulPreferenceSetAttribute", table.preference_set);
      bind(h, lib, "cublasLtMatmulAlgoGetHeuristic", table.heuristic);
      bind(h, lib, "cublasLtMatmul", table.matmul);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Unsupported(failure);
  return table;
}

const Cudnn& cudnn() {
  static Cudnn table;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    constexpr const char* lib = "libcudnn.so.9";
    try {
      void* h = open_library(lib, "a convolution on the GPU (cuDNN)");
      bind(h, lib, "cudnnCreate", table.create);
      bind(h, lib, "cudnnDestroy", table.destroy);
      bind(h, lib, "cudnnSetStream", table.set_stream);
      bind(h, lib, "cudnnGetErrorString", table.error_string);
      bind(h, lib, "cudnnCreateTensorDescriptor", table.tensor_create);
      bind(h, lib, "cudnnSetTensor4dDescriptor", table.tensor_set);
      bind(h, lib, "cudnnDestroyTensorDescriptor", table.tensor_destroy);
      bind(h, lib, "cudnnCreateFilterDescriptor", table.filter_create);
      bind(h, lib, "cudnnSetFilter4dDescriptor", table.filter_set);
      bind(h, lib, "cudnnDestroyFilterDescriptor", table.filter_destroy);
      bind(h, lib, "cudnnCreateConvolutionDescriptor", table.conv_create);
      bind(h, lib, "cudnnSetConvolution2dDescriptor", table.conv_set);
      bind(h, lib, "cudnnSetConvolutionGroupCount", table.conv_groups);
      bind(h, lib, "cudnnSetConvolutionMathType", table.conv_math);
      bind(h, lib, "cudnnDestroyConvolutionDescriptor", table.conv_destroy);
      bind(h, lib, "cudnnGetConvolutionForwardAlgorithm_v7", table.forward_algorithms);
      bind(h, lib, "cudnnGetConvolutionForwardWorkspaceSize", table.forward_workspace);
      bind(h, lib, "cudnnConvolutionForward", table.forward);
      bind(h, lib, "cudnnGetConvolutionBackwardDataAlgorithm_v7", table.backward_data_algorithms);
      bind(h, lib, "cudnnGetConvolutionBackwardDataWorkspaceSize", table.backward_data_workspace);
      bind(h, lib, "cudnnConvolutionBackwardData", table.backward_data);
      bind(h, lib, "cudnnGetConvolutionBackwardFilterAlgorithm_v7", table.backward_filter_algorithms);
      bind(h, lib, "cudnnGetConvolutionBackwardFilterWorkspaceSize", table.backward_filter_workspace);
      bind(h, lib, "cudnnConvolutionBackwardFilter", table.backward_filter);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Unsupported(failure);
  return table;
}

}  // namespace dtrain::kernels::cuda
