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

}  // namespace dtrain::kernels::cuda
