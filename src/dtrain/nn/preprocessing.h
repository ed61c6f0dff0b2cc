// Keras's preprocessing layers that sit in a model: Normalization (with adapt),
// CategoryEncoding, and the image augmentations RandomFlip and RandomCrop. The
// augmentations act while training only, drawing from a seeded stream per replica (as
// Dropout's masks), and are the identity (RandomCrop: a centre crop) at inference.
#pragma once

#include <optional>
#include <vector>

#include "dtrain/nn/dropout.h"
#include "dtrain/nn/layer.h"

namespace dtrain::nn {

// (x - mean) / max(sqrt(variance), 1e-7) per index of the kept axes; invert maps back
// (x * std + mean). The kept axes are Keras's `axis`, counted with the batch as 0: the
// last (-1, the default), several (each combination of their indices has its own mean
// and variance, weights of their dimensions' shape), or none at all (empty: one mean and
// variance for every value). mean and variance are non-trainable weights, from adapt() or
// given (one value is used for every index); until then they are 0 and 1 (the identity),
// as Keras's start.
class Normalization : public Layer {
 public:
  explicit Normalization(std::optional<std::vector<float>> mean = std::nullopt,
                         std::optional<std::vector<float>> variance = std::nullopt, bool invert = false,
                         std::string name = "normalization", std::vector<int> axis = {-1});
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  std::string class_name() const override { return "Normalization"; }
  // Keras's adapt: the mean and (population) variance of every index of the kept axes over
  // all of `data`'s other axes (data is batched, as the layer's inputs).
  void adapt(const Tensor& data);
  // Statistics gathered elsewhere (a Dataset's, in several passes), flattened in the kept
  // axes' order.
  void set_statistics(std::vector<float> mean, std::vector<float> variance);
  bool invert() const { return invert_; }
  const std::vector<int>& axis() const { return axis_; }
  // The statistics given or adapted (empty until then), for the layer's config.
  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& variance() const { return variance_; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;

 private:
  // The kept axes of an input of `rank`, from 0, increasing; each checked.
  std::vector<int> kept_axes(int rank) const;
  void store();  // the statistics into the weights, once built
  std::vector<float> mean_, variance_;
  bool invert_;
  std::vector<int> axis_;
  // The statistics' shape against an input (1 on the axes reduced over), where it is not
  // theirs already (the last axis alone).
  std::optional<Shape> broadcast_;
  Variable* mean_weight_ = nullptr;
  Variable* variance_weight_ = nullptr;
};

// Integer ids as vectors of num_tokens: "one_hot" (ids [batch] or [batch, 1] -> [batch,
// num_tokens]), "multi_hot" (1 where an id occurs) or "count" (how often it does), ids
// [batch, k] -> [batch, num_tokens] and [k] -> [num_tokens]. An id outside [0, num_tokens)
// is an error naming it. No gradient (its inputs are ids).
class CategoryEncoding : public Layer {
 public:
  explicit CategoryEncoding(std::int64_t num_tokens, std::string output_mode = "multi_hot",
                            std::string name = "category_encoding");
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "CategoryEncoding"; }
  std::int64_t num_tokens() const { return num_tokens_; }
  const std::string& output_mode() const { return output_mode_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::int64_t num_tokens_;
  std::string output_mode_;
};

// What the augmentations share: a seeded stream per replica (Dropout's), whose position a
// checkpoint saves.
class Augmentation : public Layer {
 public:
  std::optional<std::uint64_t> seed() const { return stream_.seed(); }
  std::vector<std::uint64_t> rng_state() const override { return stream_.rng_state(); }
  void set_rng_state(std::span<const std::uint64_t> state) override { stream_.set_rng_state(state); }

 protected:
  Augmentation(std::optional<std::uint64_t> seed, const std::string& name)
      : Layer(name), stream_(0.0f, seed, name + "/stream") {}
  Dropout stream_;  // its per-replica generators (nothing is dropped)
};

// Images [batch, height, width, channels] (or one, [height, width, channels]) flipped left
// to right ("horizontal"), top to bottom ("vertical") or either ("horizontal_and_vertical"),
// each image with probability 1/2 per direction, while training.
class RandomFlip : public Augmentation {
 public:
  explicit RandomFlip(std::string mode = "horizontal_and_vertical", std::optional<std::uint64_t> seed = std::nullopt,
                      std::string name = "random_flip");
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "RandomFlip"; }
  const std::string& mode() const { return mode_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::string mode_;
};

// A height x width window of each image, at a random place while training and at the
// centre at inference (Keras 3 first resizes an image of another aspect ratio at
// inference; dtrain crops its centre). An image smaller than the window is an error.
class RandomCrop : public Augmentation {
 public:
  RandomCrop(std::int64_t height, std::int64_t width, std::optional<std::uint64_t> seed = std::nullopt,
             std::string name = "random_crop");
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "RandomCrop"; }
  std::int64_t height() const { return height_; }
  std::int64_t width() const { return width_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::int64_t height_, width_;
};

// Each image turned about its centre by an angle drawn from [lower, upper] turns (factor f:
// [-f, f]; 0.25 a quarter turn), counter-clockwise for positive angles, while training;
// the identity at inference. Pixels are read bilinearly (or the nearest); places outside
// the image read by fill_mode: "reflect" (TensorFlow's d c b a | a b c d | d c b a),
// "wrap", "nearest" (the edge) or "constant" (fill_value). Runs on the CPU.
class RandomRotation : public Augmentation {
 public:
  RandomRotation(double lower, double upper, std::string fill_mode = "reflect", std::string interpolation = "bilinear",
                 std::optional<std::uint64_t> seed = std::nullopt, float fill_value = 0.0f,
                 std::string name = "random_rotation");
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "RandomRotation"; }
  double lower() const { return lower_; }
  double upper() const { return upper_; }
  const char* fill_mode() const;
  const std::string& interpolation() const { return interpolation_; }
  float fill_value() const { return fill_value_; }
  // Images turned by `turns` each (fractions of a full turn), as call() turns them.
  Tensor rotate(const Tensor& images, const std::vector<double>& turns) const;

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  double lower_, upper_;
  enum class Fill { reflect, wrap, nearest, constant } fill_;  // fill_mode, read once
  std::string interpolation_;
  double fill_coordinate(double at, std::int64_t size) const;
  float fill_value_;
};

}  // namespace dtrain::nn
