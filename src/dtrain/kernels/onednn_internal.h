// The oneDNN side of the CPU backend, shared by its translation units (cpu_onednn.cpp for
// matmul, element-wise, reductions and reorders; cpu_conv.cpp for convolution and pooling):
// the primitive cache, the keys that name a primitive, and execution on raw tensor memory.
// Internal to the kernels layer.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>

#include "dtrain/core/threads.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::kernels {
namespace onednn {

using dnnl::algorithm;
using dt = dnnl::memory::data_type;

// Everything that decides a primitive's shape and kind, packed into integers.
struct Key {
  std::array<std::int64_t, 40> v{};
  int n = 0;
  Key& add(std::int64_t x) {
    DTRAIN_CHECK_LT(n, static_cast<int>(v.size()));
    v[n++] = x;
    return *this;
  }
  Key& add_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return add(u);
  }
  Key& add_dims(const dnnl::memory::dims& d) {
    add(static_cast<std::int64_t>(d.size()));
    for (auto x : d) add(x);
    return *this;
  }
  bool operator==(const Key& o) const { return n == o.n && v == o.v; }
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::uint64_t h = 0x84222325cbf29ce4ull;
    for (int i = 0; i < k.n; ++i) h = mix64(h ^ static_cast<std::uint64_t>(k.v[i]));
    return static_cast<std::size_t>(h);
  }
};

struct Entry {
  dnnl::primitive primitive;
  std::size_t scratchpad_bytes = 0;
  // A convolution's weights (or their gradient) in the layout it chose; max pooling's
  // workspace. Zero where unused.
  dnnl::memory::desc weights;
  dnnl::memory::desc workspace;
};

inline dt to_dnnl(DType t) {
  switch (t) {
    case DType::f32: return dt::f32;
    case DType::bf16: return dt::bf16;
    case DType::f16: return dt::f16;
    case DType::i32: return dt::s32;
    case DType::u8: return dt::u8;
    case DType::string: break;
  }
  return dt::undef;
}

// Row-major dims of a tensor for oneDNN (a scalar is seen as [1]).
inline dnnl::memory::dims dims_of(const Shape& s) {
  if (s.rank() == 0) return {1};
  return dnnl::memory::dims(s.dims().begin(), s.dims().end());
}

inline dnnl::memory::dims dense_strides(const dnnl::memory::dims& d) {
  dnnl::memory::dims s(d.size());
  std::int64_t acc = 1;
  for (int i = static_cast<int>(d.size()) - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= d[i];
  }
  return s;
}

inline dnnl::memory::desc plain_desc(const dnnl::memory::dims& d, dt type) {
  return dnnl::memory::desc(d, type, dense_strides(d));
}

// `shape` padded with leading ones to `rank`.
inline dnnl::memory::dims padded_dims(const Shape& s, int rank) {
  dnnl::memory::dims d(static_cast<size_t>(rank), 1);
  for (int i = 0; i < s.rank(); ++i) d[rank - s.rank() + i] = s[i];
  return d;
}

inline dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

inline algorithm forward_algorithm(Unary op) {
  switch (op) {
    case Unary::linear: return algorithm::eltwise_linear;
    case Unary::relu: return algorithm::eltwise_relu;
    case Unary::sigmoid: return algorithm::eltwise_logistic;
    case Unary::tanh: return algorithm::eltwise_tanh;
    case Unary::gelu: return algorithm::eltwise_gelu_erf;
    case Unary::exp: return algorithm::eltwise_exp;
    case Unary::log: return algorithm::eltwise_log;
    case Unary::square: return algorithm::eltwise_square;
    case Unary::sqrt: return algorithm::eltwise_sqrt;
    case Unary::abs: return algorithm::eltwise_abs;
    case Unary::clip: return algorithm::eltwise_clip_v2;
    case Unary::gelu_tanh: return algorithm::eltwise_gelu_tanh;
  }
  return algorithm::undef;
}

// Backward algorithms read the forward's output where that is cheaper and exact.
inline bool backward_uses_output(Unary op) {
  return op == Unary::relu || op == Unary::sigmoid || op == Unary::tanh || op == Unary::exp ||
         op == Unary::sqrt;
}

inline algorithm backward_algorithm(Unary op) {
  switch (op) {
    case Unary::relu: return algorithm::eltwise_relu_use_dst_for_bwd;
    case Unary::sigmoid: return algorithm::eltwise_logistic_use_dst_for_bwd;
    case Unary::tanh: return algorithm::eltwise_tanh_use_dst_for_bwd;
    case Unary::exp: return algorithm::eltwise_exp_use_dst_for_bwd;
    case Unary::sqrt: return algorithm::eltwise_sqrt_use_dst_for_bwd;
    default: return forward_algorithm(op);
  }
}

inline algorithm binary_algorithm(Binary op) {
  switch (op) {
    case Binary::add: return algorithm::binary_add;
    case Binary::sub: return algorithm::binary_sub;
    case Binary::mul: return algorithm::binary_mul;
    case Binary::div: return algorithm::binary_div;
    case Binary::max: return algorithm::binary_max;
    case Binary::min: return algorithm::binary_min;
  }
  return algorithm::undef;
}

inline algorithm activation_algorithm(Activation a) {
  switch (a) {
    case Activation::relu: return algorithm::eltwise_relu;
    case Activation::sigmoid: return algorithm::eltwise_logistic;
    case Activation::tanh: return algorithm::eltwise_tanh;
    case Activation::gelu: return algorithm::eltwise_gelu_erf;
    case Activation::linear: break;
  }
  return algorithm::undef;
}

}  // namespace onednn

struct CpuBackend::OneDnn {
  using Key = onednn::Key;
  using KeyHash = onednn::KeyHash;
  using Entry = onednn::Entry;
  using dt = onednn::dt;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  mutable std::shared_mutex mutex;
  std::unordered_map<Key, Entry, KeyHash> cache;
  std::atomic<std::uint64_t> created{0};
  std::atomic<std::uint64_t> hits{0};
  // oneDNN 2.6 has bfloat16 matmuls only from AVX-512 on; without them (an AVX2-only CPU)
  // matmul converts bfloat16 operands to float32 instead.
  const bool native_bf16_matmul = builds_bf16_matmul(engine);
  // The same for convolutions (forward, and the backward passes that read bfloat16).
  const bool native_bf16_conv = builds_bf16_conv(engine);

  static bool builds_bf16_conv(const dnnl::engine& engine) {
    try {
      const dnnl::memory::desc src({2, 16, 8, 8}, dt::bf16, dnnl::memory::format_tag::nhwc);
      const dnnl::memory::desc wei({16, 16, 3, 3}, dt::bf16, dnnl::memory::format_tag::any);
      const dnnl::memory::desc dst({2, 16, 8, 8}, dt::f32, dnnl::memory::format_tag::nhwc);
      const dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                              src, wei, dst, {1, 1}, {1, 1}, {1, 1});
      const dnnl::convolution_forward::primitive_desc pd(d, engine);
      const std::string impl = pd.impl_info_str();
      return impl.find("ref") == std::string::npos;  // a reference kernel is slower than converting
    } catch (const dnnl::error&) {
      return false;
    }
  }

  static bool builds_bf16_matmul(const dnnl::engine& engine) {
    try {
      const dnnl::memory::desc md({16, 16}, dt::bf16, dnnl::memory::dims{16, 1});
      const dnnl::memory::desc out({16, 16}, dt::f32, dnnl::memory::dims{16, 1});
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, out), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }

  // Finds the primitive for `key`, building it with make() on a miss. References into
  // an unordered_map stay valid when it rehashes, so callers may hold the result.
  template <typename Make>
  const Entry& get(Key& key, Make&& make) {
    key.add(omp_get_max_threads());
    {
      std::shared_lock lock(mutex);
      auto it = cache.find(key);
      if (it != cache.end()) {
        hits.fetch_add(1, std::memory_order_relaxed);
        return it->second;
      }
    }
    Entry entry;
    try {
      entry = make();
    } catch (const dnnl::error& e) {
      DTRAIN_THROW(Unsupported, "oneDNN could not build a primitive: ", e.what());
    }
    std::unique_lock lock(mutex);
    auto [it, inserted] = cache.emplace(key, std::move(entry));
    if (inserted) created.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }

  // Builds the primitive of a primitive descriptor: dnnl::matmul for matmul's, and so on.
  template <typename Primitive, typename PrimitiveDesc>
  static Entry entry_of(const PrimitiveDesc& pd) {
    Entry e;
    e.scratchpad_bytes = pd.scratchpad_desc().get_size();
    e.primitive = Primitive(pd);
    return e;
  }

  static dnnl::stream& stream(const dnnl::engine& engine) {
    thread_local std::optional<dnnl::stream> s;
    if (!s) s.emplace(engine);
    return *s;
  }

  // Runs a cached primitive on raw pointers. `args` pairs a DNNL_ARG_* with memory.
  void execute(const Entry& e, std::initializer_list<std::pair<int, dnnl::memory>> args) {
    std::array<dnnl_exec_arg_t, 8> c_args{};
    int n = 0;
    for (const auto& [arg, mem] : args) c_args[n++] = {arg, mem.get()};
    void* scratch = nullptr;
    std::optional<dnnl::memory> scratch_mem;
    if (e.scratchpad_bytes) {
      scratch = cpu_allocator().allocate(e.scratchpad_bytes);
      scratch_mem.emplace(dnnl::memory::desc({static_cast<std::int64_t>(e.scratchpad_bytes)}, dt::u8,
                                             dnnl::memory::format_tag::a),
                          engine, scratch);
      c_args[n++] = {DNNL_ARG_SCRATCHPAD, scratch_mem->get()};
    }
    dnnl::stream& s = stream(engine);
    const dnnl_status_t status = dnnl_primitive_execute(e.primitive.get(), s.get(), n, c_args.data());
    s.wait();
    if (scratch) cpu_allocator().deallocate(scratch, e.scratchpad_bytes);
    if (status != dnnl_success)
      DTRAIN_THROW(InternalError, "oneDNN primitive execution failed with status ", static_cast<int>(status));
  }

  // Copies between memory of layout `from` and of layout `to` through a reorder cached
  // under `key` (the primitive's own key: a direction is added to it).
  void reorder(Key key, int direction, const dnnl::memory::desc& from, const dnnl::memory& source,
               const dnnl::memory::desc& to, const dnnl::memory& target) {
    key.add(1000 + direction);
    const Entry& r = get(key, [&] {
      return entry_of<dnnl::reorder>(dnnl::reorder::primitive_desc(engine, from, engine, to, onednn::user_scratchpad_attr()));
    });
    execute(r, {{DNNL_ARG_FROM, source}, {DNNL_ARG_TO, target}});
  }

  // The tensor's memory from its element `offset` on.
  dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t, std::int64_t offset = 0) {
    const auto bytes = offset * static_cast<std::int64_t>(dtype_size(t.dtype()));
    return dnnl::memory(d, engine, static_cast<char*>(t.raw_data()) + bytes);
  }
};

}  // namespace dtrain::kernels
