// NVIDIA's libraries (cuBLASLt, cuDNN; NCCL as it is used), opened with dlopen at
// the first GPU operation that needs them, not linked: a binary built with CUDA starts as
// fast as one without (loading cuBLASLt's half-gigabyte costs ~0.1 s a process) and runs
// where they are not installed, until a GPU operation asks for them; then the error names
// the library and what dlopen said.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

namespace dtrain::kernels::cuda {

// The cuBLASLt functions dtrain calls, with cuBLASLt's own signatures.
struct CublasLt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

// Loaded once (thread-safe); throws Unsupported naming libcublasLt.so.13 where it is not found.
const CublasLt& cublaslt();

// The cuDNN functions dtrain calls (its convolution API, which cuDNN 9 still ships beside
// its graph API), with cuDNN's own signatures.
struct Cudnn {
  decltype(&cudnnCreate) create;
  decltype(&cudnnDestroy) destroy;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnCreateTensorDescriptor) tensor_create;
  decltype(&cudnnSetTensor4dDescriptor) tensor_set;
  decltype(&cudnnDestroyTensorDescriptor) tensor_destroy;
  decltype(&cudnnCreateFilterDescriptor) filter_create;
  decltype(&cudnnSetFilter4dDescriptor) filter_set;
  decltype(&cudnnDestroyFilterDescriptor) filter_destroy;
  decltype(&cudnnCreateConvolutionDescriptor) conv_create;
  decltype(&cudnnSetConvolution2dDescriptor) conv_set;
  decltype(&cudnnSetConvolutionGroupCount) conv_groups;
  decltype(&cudnnSetConvolutionMathType) conv_math;
  decltype(&cudnnDestroyConvolutionDescriptor) conv_destroy;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) forward_algorithms;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) forward_workspace;
  decltype(&cudnnConvolutionForward) forward;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) backward_data_algorithms;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) backward_data_workspace;
  decltype(&cudnnConvolutionBackwardData) backward_data;
  decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) backward_filter_algorithms;
  decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize) backward_filter_workspace;
  decltype(&cudnnConvolutionBackwardFilter) backward_filter;
};

// Loaded once (thread-safe); throws Unsupported naming libcudnn.so.9 where it is not found.
const Cudnn& cudnn();

}  // namespace dtrain::kernels::cuda
