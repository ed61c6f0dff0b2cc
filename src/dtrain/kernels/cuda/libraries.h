// NVIDIA's libraries (cuBLASLt now; cuDNN and NCCL as they are used), opened with dlopen at
// the first GPU operation that needs them, not linked: a binary built with CUDA starts as
// fast as one without (loading cuBLASLt's half-gigabyte costs ~0.1 s a process) and runs
// where they are not installed, until a GPU operation asks for them; then the error names
// the library and what dlopen said.
#pragma once

#include <cublasLt.h>

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

}  // namespace dtrain::kernels::cuda
