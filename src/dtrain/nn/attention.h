// The layers a transformer is made of, as tf.keras.layers has them: Embedding (token ids to
// vectors), MultiHeadAttention (with Keras's weight layout, so Keras's files load) and
// GlobalAveragePooling1D. Dense on [batch, length, features], LayerNormalization and GELU
// are the existing layers.
#pragma once

#include <optional>

#include "dtrain/nn/dropout.h"
#include "dtrain/nn/layer.h"

namespace dtrain::nn {

struct EmbeddingOptions {
  std::string embeddings_initializer = "uniform";  // Keras's: uniform in [-0.05, 0.05]
  std::optional<std::uint64_t> seed;
  std::optional<Regularizer> embeddings_regularizer;
  std::optional<Constraint> embeddings_constraint;
  // Id 0 is padding: the output carries a mask (Layer::compute_mask) that is 0 where the id
  // is 0, which MultiHeadAttention, GlobalAveragePooling1D and the loss honour. Id 0 is
  // still a row of the table (input_dim counts it), as in Keras.
  bool mask_zero = false;
  std::string name = "embedding";
};

// Ids [batch, ...] (int32, or float32 holding whole numbers: Keras casts them) to rows of
// a [input_dim, output_dim] table: [batch, ..., output_dim]. An id outside [0, input_dim)
// is an error naming it.
class Embedding : public Layer {
 public:
  Embedding(std::int64_t input_dim, std::int64_t output_dim, EmbeddingOptions options = {});
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "Embedding"; }
  bool supports_masking() const override { return options_.mask_zero; }
  Tensor compute_mask(std::span<const Tensor> inputs, std::span<const Tensor> masks) const override;
  std::int64_t input_dim() const { return input_dim_; }
  std::int64_t output_dim() const { return output_dim_; }
  const EmbeddingOptions& options() const { return options_; }
  Variable& embeddings() const { return *embeddings_; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::int64_t input_dim_, output_dim_;
  EmbeddingOptions options_;
  Variable* embeddings_ = nullptr;
};

// Learned position embeddings, as keras_hub's PositionEmbedding(sequence_length): for
// [batch, length, features] inputs (length at most sequence_length), the first `length`
// rows of a [sequence_length, features] table of weights, given out for every row of the
// batch (the input's values are not read: add the two, x + PositionEmbedding(n)(x)).
class PositionEmbedding : public Layer {
 public:
  explicit PositionEmbedding(std::int64_t sequence_length, std::string initializer = "glorot_uniform",
                             std::optional<std::uint64_t> seed = std::nullopt, std::string name = "position_embedding");
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "PositionEmbedding"; }
  // Any length up to sequence_length, with the features it was built for.
  bool takes_shape_once_built(const Shape& built, const Shape& given) const override {
    return given.rank() == 3 && given[2] == built[2] && given[1] <= length_;
  }
  std::int64_t sequence_length() const { return length_; }
  const std::string& initializer() const { return initializer_; }
  std::optional<std::uint64_t> seed() const { return seed_; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::int64_t length_;
  std::string initializer_;
  std::optional<std::uint64_t> seed_;
  Variable* table_ = nullptr;
  Tensor positions_;  // int32 0 .. sequence_length-1, made once: a shorter call reads its first rows
};

// The mean over the steps of [batch, steps, features] (Keras's channels_last): [batch,
// features], or [batch, 1, features] with keepdims. With a mask, the mean of the real
// steps; a sequence with none gives zeros (Keras divides by zero there).
class GlobalAveragePooling1D : public Layer {
 public:
  explicit GlobalAveragePooling1D(bool keepdims = false, std::string name = "global_average_pooling1d")
      : Layer(std::move(name)), keepdims_(keepdims) {}
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "GlobalAveragePooling1D"; }
  bool keepdims() const { return keepdims_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;
  Tensor call_masked(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training) override;

 private:
  bool keepdims_;
};

struct MultiHeadAttentionOptions {
  std::int64_t value_dim = 0;      // 0: key_dim
  float dropout = 0.0f;            // of the attention weights, while training
  bool use_bias = true;
  std::int64_t output_shape = 0;   // the output's features (0: the query's)
  std::string kernel_initializer = "glorot_uniform";
  std::string bias_initializer = "zeros";
  std::optional<std::uint64_t> seed;  // weights, then dropout's stream
  std::optional<Regularizer> kernel_regularizer, bias_regularizer;
  std::optional<Constraint> kernel_constraint, bias_constraint;
  // Keras passes it at each call (use_causal_mask=True); a functional graph keeps it with
  // the layer: every query sees only the keys at or before its position.
  bool use_causal_mask = false;
  std::string name = "multi_head_attention";
};

// Keras's MultiHeadAttention over sequences: called on [query, value] or [query, value,
// key] ([batch, length, features] each; the key defaults to the value), it projects each
// to num_heads heads (query and key to key_dim features, value to value_dim), attends with
// the fused attention op (scale 1 / sqrt(key_dim)), and projects the heads' outputs back to
// output_shape features (default: the query's). Weights as Keras keeps them:
// query/kernel [Fq, heads, key_dim], query/bias [heads, key_dim], the same for key and
// value, attention_output/kernel [heads, value_dim, out], attention_output/bias [out].
class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(std::int64_t num_heads, std::int64_t key_dim, MultiHeadAttentionOptions options = {});
  bool takes_several_inputs() const override { return true; }
  Shape compute_output_shape(const Shape& query_shape) const override;
  Shape compute_output_shape_of(std::span<const Shape> input_shapes) const override;
  void build_several(std::span<const Shape> input_shapes) override;
  std::string class_name() const override { return "MultiHeadAttention"; }
  // Its output carries the query's mask; the inputs' masks join the attention mask.
  bool supports_masking() const override { return true; }
  std::int64_t num_heads() const { return heads_; }
  std::int64_t key_dim() const { return key_dim_; }
  std::int64_t value_dim() const { return options_.value_dim > 0 ? options_.value_dim : key_dim_; }
  const MultiHeadAttentionOptions& options() const { return options_; }
  void set_use_causal_mask(bool causal) { options_.use_causal_mask = causal; }

  // Keras's call with its keywords: key undefined means the value; attention_mask
  // [batch, queries, keys] (nonzero: may attend; undefined: all), causal as use_causal_mask.
  // `masks`, where given, are the query's, value's and key's padding masks ([batch, length];
  // Keras's implicit masks): a query attends only to real keys, and a padding query, like
  // any query that may attend to no key, gets the output projection's bias (its heads'
  // zeros; Keras gives it the mean of every value).
  Tensor attend(const Tensor& query, const Tensor& value, const Tensor& key = Tensor(),
                const Tensor& attention_mask = Tensor(), bool use_causal_mask = false, bool training = false,
                std::span<const Tensor> masks = {});

  // Keras's return_attention_scores: the weights [batch, heads, queries, keys] each query
  // gives each key (the softmax, before dropout; 0 for a hidden key, and for every key of a
  // query that may see none), for the arguments attend() takes. The fused attention never
  // makes them, so they are computed apart, on the host, and carry no gradient: for
  // looking at, not for training through.
  Tensor attention_scores(const Tensor& query, const Tensor& value, const Tensor& key = Tensor(),
                          const Tensor& attention_mask = Tensor(), bool use_causal_mask = false,
                          std::span<const Tensor> masks = {});

  std::vector<std::uint64_t> rng_state() const override { return dropout_.rng_state(); }
  void set_rng_state(std::span<const std::uint64_t> state) override { dropout_.set_rng_state(state); }

 protected:
  Tensor call(const Tensor& x, bool training) override;
  Tensor call_several(std::span<const Tensor> inputs, bool training) override;
  Tensor call_masked(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training) override;
  void build_weights(const Shape& query_shape) override;

 private:
  // Checks the call's tensors (building the layer for them on its first call) and masks;
  // the key given, or the value where none is.
  const Tensor& checked_call(const Tensor& query, const Tensor& value, const Tensor& key,
                             std::span<const Tensor> masks);
  // attend() once the layer is built and the shapes checked (key given: the value's
  // when none was; masks: query's, value's, key's, each possibly undefined).
  Tensor run(const Tensor& query, const Tensor& value, const Tensor& key, const Tensor& attention_mask,
             bool use_causal_mask, bool training, std::span<const Tensor> masks = {});
  // Which keys each query may see: the attention mask and the value's and key's padding
  // masks merged ([batch, queries or 1, keys]; undefined: all), and the query's padding
  // mask (undefined: none), on `where`.
  struct Visibility {
    Tensor seen, query_mask;
  };
  Visibility visibility(const Tensor& q_in, const Tensor& v_in, const Tensor& k_in, const Tensor& attention_mask,
                        std::span<const Tensor> masks, Device where) const;
  // x [batch, length, features] through a kernel [features, heads, depth] (and bias):
  // [batch, length, heads, depth].
  Tensor project(const Tensor& x, const Variable& kernel, const Variable* bias) const;

  std::int64_t heads_, key_dim_;
  MultiHeadAttentionOptions options_;
  std::int64_t value_features_ = 0, key_features_ = 0;  // from the first call's shapes
  Variable *query_kernel_ = nullptr, *query_bias_ = nullptr, *key_kernel_ = nullptr, *key_bias_ = nullptr,
           *value_kernel_ = nullptr, *value_bias_ = nullptr, *output_kernel_ = nullptr, *output_bias_ = nullptr;
  Dropout dropout_;  // draws the attention weights' masks (its rate is options_.dropout)
};

}  // namespace dtrain::nn
