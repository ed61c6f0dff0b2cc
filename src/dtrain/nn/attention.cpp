// Embedding, GlobalAveragePooling1D and MultiHeadAttention.
#include "dtrain/nn/attention.h"

#include <array>
#include <cmath>

#include "dtrain/nn/initializers.h"

namespace dtrain::nn {
namespace {

// A mask as float32 on `where` (a mask of ints or bytes converted on the host).
Tensor float_on(const Tensor& mask, Device where) {
  return (mask.dtype() == DType::f32 ? mask : mask.to(Device::cpu()).astype(DType::f32)).to(where);
}

}  // namespace

Embedding::Embedding(std::int64_t input_dim, std::int64_t output_dim, EmbeddingOptions options)
    : Layer(options.name), input_dim_(input_dim), output_dim_(output_dim), options_(std::move(options)) {
  if (input_dim <= 0 || output_dim <= 0)
    fail("input_dim and output_dim must be positive, got " + std::to_string(input_dim) + " and " +
         std::to_string(output_dim));
}

Shape Embedding::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() < 1) fail("expects ids [batch, ...], got a scalar");
  std::vector<std::int64_t> dims(input_shape.dims().begin(), input_shape.dims().end());
  dims.push_back(output_dim_);
  return Shape(dims);
}

void Embedding::build_weights(const Shape& /*input_shape*/) {
  Generator g(options_.seed ? *options_.seed : next_seed());
  embeddings_ = &add_weight("embeddings", initialize(options_.embeddings_initializer, {input_dim_, output_dim_}, g), true,
                            options_.embeddings_regularizer, options_.embeddings_constraint);
  embeddings_->set_read_by_rows(true);  // a parameter server's worker pulls only the rows a batch looks up
}

Tensor Embedding::call(const Tensor& x, bool /*training*/) {
  const std::string who = "layer '" + name() + "' (Embedding)";
  const Tensor ids = lookup_ids(x, input_dim_, who.c_str());  // checked once, before any row is pulled
  return lookup_rows(embeddings_->value_for_lookup(ids), ids);
}

Tensor Embedding::compute_mask(std::span<const Tensor> inputs, std::span<const Tensor> /*masks*/) const {
  if (!options_.mask_zero || inputs.empty()) return Tensor();
  // 1 where the id is not 0, in the ids' shape; read on the host (the ids are there, or small).
  const Tensor ids = inputs[0].to(Device::cpu());
  Tensor mask = Tensor::empty(ids.shape(), DType::f32);
  float* out = mask.data<float>();
  const std::int64_t n = ids.numel();
  if (ids.dtype() == DType::i32) {
    const std::int32_t* p = ids.data<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = p[i] != 0 ? 1.0f : 0.0f;
  } else if (ids.dtype() == DType::u8) {
    const std::uint8_t* p = ids.data<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = p[i] != 0 ? 1.0f : 0.0f;
  } else {
    const Tensor f = ids.dtype() == DType::f32 ? ids : ids.astype(DType::f32);
    const float* p = f.data<float>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = p[i] != 0.0f ? 1.0f : 0.0f;
  }
  return embeddings_ ? mask.to(embeddings_->value_device()) : mask;
}

PositionEmbedding::PositionEmbedding(std::int64_t sequence_length, std::string initializer,
                                     std::optional<std::uint64_t> seed, std::string name)
    : Layer(std::move(name)), length_(sequence_length), initializer_(std::move(initializer)), seed_(seed) {
  if (sequence_length <= 0) fail("sequence_length must be positive, got " + std::to_string(sequence_length));
  check_initializer_name(initializer_);
}

Shape PositionEmbedding::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 3 || input_shape[1] > length_)
    fail("expects [batch, length, features] with length at most its sequence_length " + std::to_string(length_) +
         ", got " + input_shape.to_string());
  return input_shape;
}

void PositionEmbedding::build_weights(const Shape& input_shape) {
  Generator g(seed_ ? *seed_ : next_seed());
  table_ = &add_weight("embeddings", initialize(initializer_, {length_, input_shape[2]}, g));
  std::vector<std::int32_t> positions(static_cast<std::size_t>(length_));
  for (std::int64_t i = 0; i < length_; ++i) positions[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  positions_ = Tensor::from_vector(Shape{length_}, positions);
}

Tensor PositionEmbedding::call(const Tensor& x, bool /*training*/) {
  // Zeros of the batch's shape plus the table's first rows (as many as the input's steps):
  // those rows for every sequence, their gradient the sum over the batch.
  const std::int64_t steps = x.dim(1);
  Tensor rows = table_->value();
  if (steps < length_) rows = lookup_rows(rows, positions_.slice(0, steps));
  return add(Tensor::zeros(x.shape(), DType::f32, x.device()), reshape(rows, {1, steps, x.dim(2)}));
}

Shape GlobalAveragePooling1D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 3) fail("expects [batch, steps, features], got " + input_shape.to_string());
  if (keepdims_) return {input_shape[0], 1, input_shape[2]};
  return {input_shape[0], input_shape[2]};
}

Tensor GlobalAveragePooling1D::call(const Tensor& x, bool /*training*/) {
  const Tensor y = reduce_mean(x, {1});
  return reshape(y, compute_output_shape(x.shape()).with_dim(0, x.dim(0)));
}

Tensor GlobalAveragePooling1D::call_masked(std::span<const Tensor> inputs, std::span<const Tensor> masks,
                                           bool training) {
  const Tensor& x = inputs[0];
  const Tensor& m = masks[0];
  if (!m.defined()) return call(x, training);
  if (m.rank() != 2) fail("expects a mask [batch, steps] for " + x.shape().to_string() + ", got " + m.shape().to_string());
  // The sum of the real steps over their count (at least 1: a sequence of padding gives 0).
  const Tensor total = reduce_sum(mul(x, reshape(m, {m.dim(0), m.dim(1), 1})), {1});
  const Tensor count = clip_by_value(reduce_sum(m, {1}, /*keepdims=*/true), 1.0f, 3.0e38f);
  return reshape(div(total, count), compute_output_shape(x.shape()).with_dim(0, x.dim(0)));
}

MultiHeadAttention::MultiHeadAttention(std::int64_t num_heads, std::int64_t key_dim, MultiHeadAttentionOptions options)
    : Layer(options.name), heads_(num_heads), key_dim_(key_dim), options_(std::move(options)),
      dropout_(std::max(0.0f, std::min(options_.dropout, 0.999f)), options_.seed ? std::optional(*options_.seed + 1) : std::nullopt,
               options_.name + "_dropout") {
  if (num_heads <= 0 || key_dim <= 0)
    fail("num_heads and key_dim must be positive, got " + std::to_string(num_heads) + " and " + std::to_string(key_dim));
  if (options_.value_dim < 0 || options_.output_shape < 0)
    fail("value_dim and output_shape must be positive (0: the defaults)");
  if (!(options_.dropout >= 0.0f && options_.dropout < 1.0f))
    fail("dropout must be in [0, 1), got " + std::to_string(options_.dropout));
}

Shape MultiHeadAttention::compute_output_shape(const Shape& query_shape) const {
  if (query_shape.rank() != 3)
    fail("expects a query [batch, length, features], got " + query_shape.to_string() +
         " (attention over other axes, Keras's attention_axes, is not supported)");
  return query_shape.with_dim(2, options_.output_shape > 0 ? options_.output_shape : query_shape[2]);
}

Shape MultiHeadAttention::compute_output_shape_of(std::span<const Shape> shapes) const {
  if (shapes.size() < 2 || shapes.size() > 3)
    fail("is called on [query, value] or [query, value, key], got " + std::to_string(shapes.size()) + " tensor(s)");
  for (const Shape& s : shapes)
    if (s.rank() != 3) fail("expects query, value and key [batch, length, features], got " + s.to_string());
  const Shape& value = shapes[1];
  const Shape& key = shapes.size() > 2 ? shapes[2] : shapes[1];
  if (key[1] != value[1])
    fail("expects a key and a value of one length, got " + key.to_string() + " and " + value.to_string());
  if (built() && (value[2] != value_features_ || key[2] != key_features_ || shapes[0][2] != query_kernel_->shape()[0]))
    fail("was built for query, value and key of " + std::to_string(query_kernel_->shape()[0]) + ", " +
         std::to_string(value_features_) + " and " + std::to_string(key_features_) + " features, got " +
         shapes[0].to_string() + ", " + value.to_string() + " and " + key.to_string());
  return compute_output_shape(shapes[0]);
}

void MultiHeadAttention::build_several(std::span<const Shape> shapes) {
  compute_output_shape_of(shapes);
  value_features_ = shapes[1][2];
  key_features_ = shapes.size() > 2 ? shapes[2][2] : shapes[1][2];
  build(shapes[0]);
}

void MultiHeadAttention::build_weights(const Shape& query_shape) {
  if (value_features_ == 0) value_features_ = key_features_ = query_shape[2];  // built from the query alone: self-attention
  Generator g(options_.seed ? *options_.seed : next_seed());
  const std::int64_t out = options_.output_shape > 0 ? options_.output_shape : query_shape[2], dv = value_dim();
  auto kernel = [&](const std::string& name, Shape shape) {
    return &add_weight(name + "/kernel", initialize(options_.kernel_initializer, shape, g), true,
                       options_.kernel_regularizer, options_.kernel_constraint);
  };
  auto bias = [&](const std::string& name, Shape shape) -> Variable* {
    if (!options_.use_bias) return nullptr;
    return &add_weight(name + "/bias", initialize(options_.bias_initializer, shape, g), true, options_.bias_regularizer,
                       options_.bias_constraint);
  };
  // Keras's order: each projection's kernel, then its bias.
  query_kernel_ = kernel("query", {query_shape[2], heads_, key_dim_});
  query_bias_ = bias("query", {heads_, key_dim_});
  key_kernel_ = kernel("key", {key_features_, heads_, key_dim_});
  key_bias_ = bias("key", {heads_, key_dim_});
  value_kernel_ = kernel("value", {value_features_, heads_, dv});
  value_bias_ = bias("value", {heads_, dv});
  output_kernel_ = kernel("attention_output", {heads_, dv, out});
  output_bias_ = bias("attention_output", {out});
}

Tensor MultiHeadAttention::project(const Tensor& x, const Variable& kernel, const Variable* bias) const {
  const Shape& k = kernel.shape();
  const Tensor w = reshape(kernel.value(), {k[0], k[1] * k[2]});
  const Tensor b = bias ? reshape(bias->value(), {k[1] * k[2]}) : Tensor();
  return reshape(dense(x, w, b, Activation::linear, dtype_policy().compute_dtype), {x.dim(0), x.dim(1), k[1], k[2]});
}

const Tensor& MultiHeadAttention::checked_call(const Tensor& query, const Tensor& value, const Tensor& key,
                                               std::span<const Tensor> masks) {
  const Tensor& k_given = key.defined() ? key : value;
  for (const Tensor* t : {&query, &value, &k_given}) t->check_defined(name().c_str());
  const std::array<Shape, 3> shapes{query.shape(), value.shape(), k_given.shape()};
  if (built()) compute_output_shape_of(shapes);
  else build_several(shapes);  // checks them too
  if (!masks.empty() && masks.size() != 3)
    fail("takes the query's, value's and key's masks (3), got " + std::to_string(masks.size()));
  return k_given;
}

Tensor MultiHeadAttention::attend(const Tensor& query, const Tensor& value, const Tensor& key,
                                  const Tensor& attention_mask, bool use_causal_mask, bool training,
                                  std::span<const Tensor> masks) {
  const Tensor& k_given = checked_call(query, value, key, masks);
  return run_as_call([&] { return run(query, value, k_given, attention_mask, use_causal_mask, training, masks); });
}

MultiHeadAttention::Visibility MultiHeadAttention::visibility(const Tensor& q_in, const Tensor& v_in,
                                                             const Tensor& k_in, const Tensor& attention_mask,
                                                             std::span<const Tensor> masks, Device where) const {
  // The padding masks, as Keras merges them: a key is seen where the value's and the key's
  // masks say it is real (one [batch, 1, keys] row for every query, which keeps memory linear
  // in the length), and a padding query's output is zeroed.
  auto padding = [&](std::size_t i, const Tensor& of) -> Tensor {
    if (masks.size() <= i || !masks[i].defined()) return Tensor();
    const Tensor& m = masks[i];
    if (!(m.shape() == Shape{of.dim(0), of.dim(1)}))
      fail("expects masks [batch, length] = " + Shape{of.dim(0), of.dim(1)}.to_string() + " for " +
           of.shape().to_string() + ", got " + m.shape().to_string());
    return float_on(m, where);
  };
  Visibility out;
  out.query_mask = padding(0, q_in);
  const Tensor value_mask = padding(1, v_in), key_mask = padding(2, k_in);
  for (const Tensor* m : {&value_mask, &key_mask})
    if (m->defined()) {
      const Tensor row = m->reshape({m->dim(0), 1, m->dim(1)});
      out.seen = out.seen.defined() ? mul(out.seen, row) : row;
    }
  if (attention_mask.defined()) {
    const Tensor given = float_on(attention_mask, where);
    out.seen = out.seen.defined() ? mul(given, out.seen) : given;
  }
  return out;
}

Tensor MultiHeadAttention::attention_scores(const Tensor& query, const Tensor& value, const Tensor& key,
                                            const Tensor& attention_mask, bool use_causal_mask,
                                            std::span<const Tensor> masks) {
  const Tensor& k_given = checked_call(query, value, key, masks);
  const Device where = query_kernel_->value_device();
  const Tensor q_in = query.to(where), v_in = value.to(where), k_in = k_given.to(where);
  const auto [seen, query_mask] = visibility(q_in, v_in, k_in, attention_mask, masks, where);
  const Tensor q = project(q_in, *query_kernel_, query_bias_).to(Device::cpu());
  const Tensor k = project(k_in, *key_kernel_, key_bias_).to(Device::cpu());
  const std::int64_t B = q.dim(0), T = q.dim(1), S = k.dim(1), H = heads_, D = key_dim_;
  // [B|1, T|1, S] on the host, or undefined.
  const Tensor mask = seen.defined() ? attention_mask_as_read(seen, B, T, S, Device::cpu()) : Tensor();
  const kernels::MaskStrides strides = kernels::attention_mask_strides(mask.defined() ? &mask : nullptr);
  const std::vector<float> qm = query_mask.defined() ? query_mask.to_vector() : std::vector<float>();
  Tensor out = Tensor::zeros(Shape{B, H, T, S});
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* mp = mask.defined() ? mask.data<float>() : nullptr;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> row(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        if (!qm.empty() && qm[static_cast<std::size_t>(b * T + t)] == 0.0f) continue;  // a padding query: zeros
        double top = -INFINITY;
        for (std::int64_t s = 0; s < S; ++s) {
          const bool visible = (!use_causal_mask || s <= t) && (!mp || mp[b * strides.batch + t * strides.query + s] != 0.0f);
          double x = -INFINITY;
          if (visible) {
            x = 0.0;
            for (std::int64_t d = 0; d < D; ++d)
              x += static_cast<double>(qp[((b * T + t) * H + h) * D + d]) * kp[((b * S + s) * H + h) * D + d];
            x *= scale;
          }
          row[static_cast<std::size_t>(s)] = x;
          top = std::max(top, x);
        }
        if (top == -INFINITY) continue;  // sees no key: zeros
        double sum = 0.0;
        for (double& x : row) sum += (x = std::exp(x - top));
        float* o = out.data<float>() + ((b * H + h) * T + t) * S;
        for (std::int64_t s = 0; s < S; ++s) o[s] = static_cast<float>(row[static_cast<std::size_t>(s)] / sum);
      }
  return out;
}

Tensor MultiHeadAttention::run(const Tensor& query, const Tensor& value, const Tensor& key,
                               const Tensor& attention_mask, bool use_causal_mask, bool training,
                               std::span<const Tensor> masks) {
  const Device where = query_kernel_->value_device();
  const Tensor q_in = query.to(where), v_in = value.to(where), k_in = key.to(where);
  const auto [seen, query_mask] = visibility(q_in, v_in, k_in, attention_mask, masks, where);
  const Tensor q = project(q_in, *query_kernel_, query_bias_);
  const Tensor k = project(k_in, *key_kernel_, key_bias_);
  const Tensor v = project(v_in, *value_kernel_, value_bias_);
  AttentionCall call{.scale = 1.0f / std::sqrt(static_cast<float>(key_dim_)),
                     .causal = use_causal_mask,
                     .mask = seen,
                     .dropout_rate = training ? options_.dropout : 0.0f};
  if (call.dropout_rate > 0.0f)
    call.dropout_generator =
        dropout_.draw(static_cast<std::uint64_t>(q_in.dim(0) * heads_ * q_in.dim(1) * k_in.dim(1)));
  Tensor o = scaled_dot_product_attention(q, k, v, call);  // [B, T, H, Dv]
  if (query_mask.defined()) o = mul(o, query_mask.reshape({o.dim(0), o.dim(1), 1, 1}));
  const Shape& ok = output_kernel_->shape();
  const Tensor w = reshape(output_kernel_->value(), {ok[0] * ok[1], ok[2]});
  return dense(reshape(o, {o.dim(0), o.dim(1), ok[0] * ok[1]}), w, output_bias_ ? output_bias_->value() : Tensor(),
               Activation::linear, dtype_policy().compute_dtype);
}

// Layer's operator() has built the layer and checked the shapes before these.
Tensor MultiHeadAttention::call(const Tensor& x, bool training) {
  return run(x, x, x, Tensor(), options_.use_causal_mask, training);
}

Tensor MultiHeadAttention::call_masked(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training) {
  // One input (a Sequential's self-attention) is the query, the value and the key; Keras
  // reads the key's mask only where a key is given.
  const Tensor& value = inputs.size() > 1 ? inputs[1] : inputs[0];
  const std::array<Tensor, 3> m{masks[0], inputs.size() > 1 ? masks[1] : masks[0],
                                inputs.size() > 2 ? masks[2] : Tensor()};
  return run(inputs[0], value, inputs.size() > 2 ? inputs[2] : value, Tensor(), options_.use_causal_mask, training, m);
}

Tensor MultiHeadAttention::call_several(std::span<const Tensor> inputs, bool training) {
  return run(inputs[0], inputs[1], inputs.size() > 2 ? inputs[2] : inputs[1], Tensor(), options_.use_causal_mask,
             training);
}

}  // namespace dtrain::nn
