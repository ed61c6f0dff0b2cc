// Embedding lookups, and scaled dot-product attention as one op: forward and backward are the backend's fused
// attention kernels (no T × S matrix of weights is kept for backward; the kernels recompute
// the weights from each query's log-sum-exp).
#include <cmath>

#include "dtrain/autograd/op_util.h"

namespace dtrain {

Tensor attention_mask_as_read(const Tensor& mask, std::int64_t batch, std::int64_t queries, std::int64_t keys,
                              Device where) {
  Tensor m = mask.dtype() == DType::f32 ? mask : mask.to(Device::cpu()).astype(DType::f32);
  if (m.rank() == 2) m = m.reshape({1, m.dim(0), m.dim(1)});
  if (m.rank() != 3 || (m.dim(0) != batch && m.dim(0) != 1) || (m.dim(1) != queries && m.dim(1) != 1) ||
      m.dim(2) != keys)
    DTRAIN_THROW(InvalidArgument, "attention: the mask must be [batch, queries, keys] = ",
                 Shape{batch, queries, keys}.to_string(),
                 " (or [queries, keys], [1, queries, keys] or [batch, 1, keys]), got ", mask.shape().to_string());
  return m.to(where);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& call) {
  for (const Tensor* t : {&q, &k, &v}) detail::check_float(*t, "attention");
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    DTRAIN_THROW(InvalidArgument, "attention: q, k and v must be [batch, length, heads, depth], got ",
                 q.shape().to_string(), ", ", k.shape().to_string(), " and ", v.shape().to_string());
  const Tensor mask =
      call.mask.defined() ? attention_mask_as_read(call.mask, q.dim(0), q.dim(1), k.dim(1), q.device()) : Tensor();
  kernels::AttentionOptions o{.scale = call.scale,
                              .causal = call.causal,
                              .mask = mask.defined() ? &mask : nullptr,
                              .dropout_rate = call.dropout_rate,
                              .dropout_generator = call.dropout_generator};
  Tensor out = detail::empty_on(q, {q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  Tensor lse = detail::empty_on(q, {q.dim(0), q.dim(1), q.dim(2)});
  detail::backend_of(q).attention(q, k, v, o, out, lse);
  detail::record(out, [&] {
    return [q, k, v, out, lse, mask, o](const Tensor& dout, BackwardContext& ctx) {
      kernels::AttentionOptions ob = o;
      ob.mask = mask.defined() ? &mask : nullptr;
      Tensor dq = detail::empty_on(dout, q.shape()), dk = detail::empty_on(dout, k.shape()),
             dv = detail::empty_on(dout, v.shape());
      detail::backend_of(dout).attention_backward(q, k, v, out, lse, dout, ob, dq, dk, dv);
      if (ctx.needs(0)) ctx.add(0, dq);
      if (ctx.needs(1)) ctx.add(1, dk);
      if (ctx.needs(2)) ctx.add(2, dv);
    };
  }, q, k, v);
  return out;
}

}  // namespace dtrain

namespace dtrain {

Tensor lookup_ids(const Tensor& ids, std::int64_t vocabulary, const char* who) {
  if (ids.dtype() != DType::f32 && ids.dtype() != DType::i32 && ids.dtype() != DType::u8)
    DTRAIN_THROW(InvalidArgument, who, ": ids must be integers (int32, or float32 holding whole numbers), got ",
                 dtype_name(ids.dtype()));
  // Checked on the host, naming the first bad id: a lookup outside the table is a mistake
  // in the data, not something to clamp.
  const std::int64_t n = ids.numel();
  const Tensor host = ids.to(Device::cpu());
  Tensor checked = Tensor::empty(ids.shape(), DType::i32);
  std::int32_t* out = checked.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const double id = host.dtype() == DType::f32   ? static_cast<double>(host.data<float>()[i])
                      : host.dtype() == DType::i32 ? static_cast<double>(host.data<std::int32_t>()[i])
                                                   : static_cast<double>(host.data<std::uint8_t>()[i]);
    if (!(id >= 0 && id < static_cast<double>(vocabulary)) || id != std::floor(id))
      DTRAIN_THROW(InvalidArgument, who, ": id ", id, " at position ", i, " of ids ", ids.shape().to_string(),
                   " is not a whole number in [0, ", vocabulary, ") (the input_dim)");
    out[i] = static_cast<std::int32_t>(id);
  }
  return checked;
}

Tensor embedding_lookup(const Tensor& table, const Tensor& ids, const char* who) {
  detail::check_float(table, who);
  if (table.rank() != 2) DTRAIN_THROW(InvalidArgument, who, ": the table must be [vocabulary, depth], got ", table.shape().to_string());
  return lookup_rows(table, lookup_ids(ids, table.dim(0), who));
}

Tensor lookup_rows(const Tensor& table, const Tensor& ids) {
  detail::check_float(table, "lookup_rows");
  ids.check_dtype(DType::i32, "lookup_rows (ids)");
  const std::int64_t n = ids.numel();
  const Tensor flat = ids.reshape(Shape{n}).to(table.device());
  std::vector<std::int64_t> dims(ids.shape().dims().begin(), ids.shape().dims().end());
  dims.push_back(table.dim(1));
  Tensor rows = detail::empty_on(table, {n, table.dim(1)});
  detail::backend_of(table).gather_rows(table, flat, rows);
  Tensor y = rows.reshape(Shape(dims));
  detail::record(y, [&] {
    return [flat, shape = table.shape(), n](const Tensor& dy, BackwardContext& ctx) {
      Tensor dtable = Tensor::zeros(shape, DType::f32, dy.device());
      detail::backend_of(dy).scatter_add_rows(flat, dy.reshape({n, shape[1]}), dtable);
      ctx.add(0, dtable);
    };
  }, table);
  return y;
}

}  // namespace dtrain
