// Preprocessing layers: Normalization, CategoryEncoding, RandomFlip and RandomCrop. The
// augmentations move whole pixels, so they are gathers of pixel rows (autograd's gather,
// whose gradient adds back into the pixels taken).
#include "dtrain/nn/preprocessing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtrain/autograd/ops.h"

namespace dtrain::nn {
namespace {

constexpr float kEpsilon = 1e-7f;  // Keras's backend.epsilon()

// x's pixels [N, H, W, C] at `pixels` (N' * H' * W' indices into N * H * W), as [N', H', W', C].
// A gather on the host (RandomFlip's tensors are on the CPU).
Tensor take_pixels(const Tensor& x, const std::vector<std::int32_t>& pixels, const Shape& out) {
  const std::int64_t channels = x.dim(3);
  const Tensor rows = reshape(x, {x.numel() / channels, channels});
  const Tensor index = Tensor::from_vector({static_cast<std::int64_t>(pixels.size())}, std::span<const std::int32_t>(pixels));
  return reshape(gather(rows, index, 0), out);
}

// [H, W, C] as a batch of one, and back.
Shape as_batch(const Shape& s) { return s.rank() == 3 ? Shape{1, s[0], s[1], s[2]} : s; }

}  // namespace

// ---- Normalization

Normalization::Normalization(std::optional<std::vector<float>> mean, std::optional<std::vector<float>> variance,
                             bool invert, std::string name, std::vector<int> axis)
    : Layer(std::move(name)), invert_(invert), axis_(std::move(axis)) {
  for (std::size_t i = 0; i < axis_.size(); ++i) {
    if (axis_[i] == 0) fail("axis may not be 0 (the batch)");
    for (std::size_t j = 0; j < i; ++j)
      if (axis_[j] == axis_[i]) fail("axis " + std::to_string(axis_[i]) + " is given twice");
  }
  if (mean.has_value() != variance.has_value()) fail("give both mean and variance, or neither (then call adapt)");
  if (mean) set_statistics(std::move(*mean), std::move(*variance));
}

std::vector<int> Normalization::kept_axes(int rank) const {
  std::vector<int> kept;
  for (int a : axis_) {
    const int d = a < 0 ? a + rank : a;
    if (d < 0 || d >= rank) fail("axis " + std::to_string(a) + " is outside inputs of rank " + std::to_string(rank));
    // (A batch of scalars, rank 1, keeps its only axis, as Keras's default does there.)
    if (d == 0 && rank > 1) fail("axis " + std::to_string(a) + " is the batch axis of inputs of rank " + std::to_string(rank));
    kept.push_back(d);
  }
  std::sort(kept.begin(), kept.end());
  for (std::size_t i = 1; i < kept.size(); ++i)
    if (kept[i] == kept[i - 1]) fail("axes " + std::to_string(kept[i]) + " and " + std::to_string(kept[i] - rank) + " are one");
  return kept;
}

void Normalization::set_statistics(std::vector<float> mean, std::vector<float> variance) {
  if (mean.size() != variance.size() || mean.empty())
    fail("mean and variance need one value per feature, got " + std::to_string(mean.size()) + " and " +
         std::to_string(variance.size()));
  for (std::size_t i = 0; i < mean.size(); ++i)
    if (!std::isfinite(mean[i]) || !std::isfinite(variance[i]) || variance[i] < 0)
      fail("feature " + std::to_string(i) + " has mean " + std::to_string(mean[i]) + " and variance " +
           std::to_string(variance[i]) + "; both must be finite, the variance >= 0");
  if (mean_weight_ && mean.size() > 1 && static_cast<std::int64_t>(mean.size()) != mean_weight_->numel())
    fail("was built for " + std::to_string(mean_weight_->numel()) + " features, the statistics have " +
         std::to_string(mean.size()));
  mean_ = std::move(mean);
  variance_ = std::move(variance);
  store();
}

void Normalization::adapt(const Tensor& data) {
  data.check_defined("Normalization.adapt");
  if (data.rank() < 1 || data.numel() == 0) fail("adapt needs data with a feature axis, got " + data.shape().to_string());
  const std::vector<int> kept = kept_axes(data.rank());
  const Tensor values = data.on_cpu() ? data : data.to(Device{});
  const Tensor f = values.dtype() == DType::f32 ? values : values.astype(DType::f32);
  // Each element's feature: its index over the kept axes.
  std::vector<bool> reduced(static_cast<std::size_t>(f.rank()), true);
  std::int64_t features = 1;
  for (int k : kept) {
    reduced[static_cast<std::size_t>(k)] = false;
    features *= f.dim(k);
  }
  const std::int64_t n = f.numel(), rows = n / features;
  const std::vector<std::int64_t> feature = reduced_offsets(f.shape(), reduced);
  std::vector<double> sum(static_cast<std::size_t>(features), 0.0), squares(static_cast<std::size_t>(features), 0.0);
  const float* p = f.data<float>();
  for (std::int64_t i = 0; i < n; ++i) sum[static_cast<std::size_t>(feature[static_cast<std::size_t>(i)])] += p[i];
  std::vector<float> mean(static_cast<std::size_t>(features)), variance(static_cast<std::size_t>(features));
  for (std::size_t j = 0; j < mean.size(); ++j) mean[j] = static_cast<float>(sum[j] / static_cast<double>(rows));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto j = static_cast<std::size_t>(feature[static_cast<std::size_t>(i)]);
    const double d = p[i] - static_cast<double>(mean[j]);
    squares[j] += d * d;
  }
  for (std::size_t j = 0; j < variance.size(); ++j) variance[j] = static_cast<float>(squares[j] / static_cast<double>(rows));
  set_statistics(std::move(mean), std::move(variance));
}

void Normalization::store() {
  if (!mean_weight_ || mean_.empty()) return;
  // One value given stands for every index, as Keras broadcasts it.
  const auto spread = [&](const std::vector<float>& v) {
    return v.size() == 1 ? Tensor::full(mean_weight_->shape(), v[0])
                         : Tensor::from_vector(mean_weight_->shape(), std::span<const float>(v));
  };
  mean_weight_->assign(spread(mean_));
  variance_weight_->assign(spread(variance_));
}

void Normalization::build_weights(const Shape& input_shape) {
  if (input_shape.rank() < 1) fail("expects inputs with a feature axis, got " + input_shape.to_string());
  const std::vector<int> kept = kept_axes(input_shape.rank());
  std::vector<std::int64_t> dims, broadcast(static_cast<std::size_t>(input_shape.rank()), 1);
  std::int64_t features = 1;
  for (int d : kept) {
    dims.push_back(input_shape[d]);
    broadcast[static_cast<std::size_t>(d)] = input_shape[d];
    features *= input_shape[d];
  }
  if (mean_.size() > 1 && static_cast<std::int64_t>(mean_.size()) != features)
    fail("its statistics have " + std::to_string(mean_.size()) + " features, the input " + input_shape.to_string());
  // The last axis's statistics broadcast as they are; others are shaped to the input.
  if (kept != std::vector<int>{input_shape.rank() - 1}) broadcast_ = Shape(broadcast);
  mean_weight_ = &add_weight("mean", Tensor::zeros(Shape(dims)), false);
  variance_weight_ = &add_weight("variance", Tensor::full(Shape(dims), 1.0f), false);
  store();
}

Tensor Normalization::call(const Tensor& x, bool /*training*/) {
  // max(sqrt(variance), epsilon) through the backend, where the weights are: no host copy.
  const Tensor variance = broadcast_ ? reshape(variance_weight_->value(), *broadcast_) : variance_weight_->value();
  const Tensor mean = broadcast_ ? reshape(mean_weight_->value(), *broadcast_) : mean_weight_->value();
  const Tensor scale = clip_by_value(sqrt(variance), kEpsilon, std::numeric_limits<float>::max());
  const Tensor input = x.dtype() == DType::f32 ? x : x.astype(DType::f32);
  return invert_ ? add(mul(input, scale), mean) : div(sub(input, mean), scale);
}

// ---- CategoryEncoding

CategoryEncoding::CategoryEncoding(std::int64_t num_tokens, std::string output_mode, std::string name)
    : Layer(std::move(name)), num_tokens_(num_tokens), output_mode_(std::move(output_mode)) {
  if (num_tokens_ <= 0) fail("num_tokens must be positive, got " + std::to_string(num_tokens_));
  if (output_mode_ != "one_hot" && output_mode_ != "multi_hot" && output_mode_ != "count")
    fail("output_mode must be \"one_hot\", \"multi_hot\" or \"count\", got \"" + output_mode_ + "\"");
}

Shape CategoryEncoding::compute_output_shape(const Shape& input_shape) const {
  if (output_mode_ == "one_hot") {
    if (input_shape.rank() == 1) return {input_shape[0], num_tokens_};
    if (input_shape.rank() == 2 && input_shape[1] == 1) return {input_shape[0], num_tokens_};
    fail("one_hot takes ids [batch] or [batch, 1], got " + input_shape.to_string());
  }
  if (input_shape.rank() == 1) return {num_tokens_};
  if (input_shape.rank() == 2) return {input_shape[0], num_tokens_};
  fail("takes ids [batch, k] (or one sample's [k]), got " + input_shape.to_string());
}

Tensor CategoryEncoding::call(const Tensor& x, bool /*training*/) {
  const Tensor ids = x.on_cpu() ? x : x.to(Device{});
  const Shape out_shape = compute_output_shape(ids.shape());
  const std::int64_t rows = out_shape.rank() == 1 ? 1 : out_shape[0];
  const std::int64_t per = ids.numel() / std::max<std::int64_t>(rows, 1);
  Tensor out = Tensor::zeros(out_shape);
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    double v = 0;
    switch (ids.dtype()) {
      case DType::i32: v = ids.data<std::int32_t>()[i]; break;
      case DType::u8: v = ids.data<std::uint8_t>()[i]; break;
      case DType::f32: v = ids.data<float>()[i]; break;
      default: fail("takes integer ids, got " + std::string(dtype_name(ids.dtype())));
    }
    if (v != std::floor(v) || v < 0 || v >= static_cast<double>(num_tokens_))
      fail("id " + std::to_string(v) + " (element " + std::to_string(i) + ") is not in [0, " + std::to_string(num_tokens_) +
           ")");
    float& cell = out.data<float>()[(i / per) * num_tokens_ + static_cast<std::int64_t>(v)];
    cell = output_mode_ == "count" ? cell + 1.0f : 1.0f;
  }
  return x.on_cpu() ? out : out.to(x.device());
}

// ---- RandomFlip

RandomFlip::RandomFlip(std::string mode, std::optional<std::uint64_t> seed, std::string name)
    : Augmentation(seed, name), mode_(std::move(mode)) {
  if (mode_ != "horizontal" && mode_ != "vertical" && mode_ != "horizontal_and_vertical")
    fail("mode must be \"horizontal\", \"vertical\" or \"horizontal_and_vertical\", got \"" + mode_ + "\"");
}

Shape RandomFlip::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4 && input_shape.rank() != 3)
    fail("expects images [batch, height, width, channels] or one [height, width, channels], got " +
         input_shape.to_string());
  return input_shape;
}

Tensor RandomFlip::call(const Tensor& x, bool training) {
  compute_output_shape(x.shape());
  if (!training) return x;
  if (!x.on_cpu()) fail("flips images on the CPU; the images are on " + x.device().to_string());
  const Shape s = as_batch(x.shape());
  const std::int64_t n = s[0], h = s[1], w = s[2];
  const Generator g = stream_.draw(static_cast<std::uint64_t>(2 * n));
  std::vector<std::int32_t> pixels(static_cast<std::size_t>(n * h * w));
  for (std::int64_t b = 0; b < n; ++b) {
    const bool across = mode_ != "vertical" && (g.bits_at(static_cast<std::uint64_t>(2 * b)) >> 63) != 0;
    const bool down = mode_ != "horizontal" && (g.bits_at(static_cast<std::uint64_t>(2 * b + 1)) >> 63) != 0;
    for (std::int64_t i = 0; i < h; ++i)
      for (std::int64_t j = 0; j < w; ++j)
        pixels[static_cast<std::size_t>((b * h + i) * w + j)] =
            static_cast<std::int32_t>((b * h + (down ? h - 1 - i : i)) * w + (across ? w - 1 - j : j));
  }
  return reshape(take_pixels(reshape(x, s), pixels, s), x.shape());
}

// ---- RandomCrop

RandomCrop::RandomCrop(std::int64_t height, std::int64_t width, std::optional<std::uint64_t> seed, std::string name)
    : Augmentation(seed, name), height_(height), width_(width) {
  if (height_ <= 0 || width_ <= 0)
    fail("height and width must be positive, got " + std::to_string(height_) + " and " + std::to_string(width_));
}

Shape RandomCrop::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4 && input_shape.rank() != 3)
    fail("expects images [batch, height, width, channels] or one [height, width, channels], got " +
         input_shape.to_string());
  const int at = input_shape.rank() - 3;
  if (input_shape[at] < height_ || input_shape[at + 1] < width_)
    fail("crops " + std::to_string(height_) + " x " + std::to_string(width_) + " out of images " + input_shape.to_string() +
         ", which are smaller");
  Shape out = input_shape;
  return out.with_dim(at, height_).with_dim(at + 1, width_);
}

// Slices of each image (its own window while training, the centre at inference), joined:
// copies through the backend, so on any device and with the gradient to the pixels taken.
Tensor RandomCrop::call(const Tensor& x, bool training) {
  const Shape out = compute_output_shape(x.shape());  // also: no image smaller than the window
  const Shape s = as_batch(x.shape());
  const std::int64_t n = s[0], h = s[1], w = s[2];
  const Tensor images = reshape(x, s);
  if (!training) {
    const Tensor rows = slice_axis(images, 1, (h - height_) / 2, height_);
    return reshape(slice_axis(rows, 2, (w - width_) / 2, width_), out);
  }
  const Generator g = stream_.draw(static_cast<std::uint64_t>(2 * n));
  std::vector<Tensor> windows;
  for (std::int64_t b = 0; b < n; ++b) {
    const auto top = static_cast<std::int64_t>(g.bits_at(static_cast<std::uint64_t>(2 * b)) %
                                               static_cast<std::uint64_t>(h - height_ + 1));
    const auto left = static_cast<std::int64_t>(g.bits_at(static_cast<std::uint64_t>(2 * b + 1)) %
                                                static_cast<std::uint64_t>(w - width_ + 1));
    windows.push_back(slice_axis(slice_axis(slice_axis(images, 0, b, 1), 1, top, height_), 2, left, width_));
  }
  return reshape(concatenate(windows, 0), out);
}

// ---- RandomRotation

RandomRotation::RandomRotation(double lower, double upper, std::string fill_mode, std::string interpolation,
                               std::optional<std::uint64_t> seed, float fill_value, std::string name)
    : Augmentation(seed, name),
      lower_(lower),
      upper_(upper),
      fill_(fill_mode == "wrap" ? Fill::wrap : fill_mode == "nearest" ? Fill::nearest
                                                : fill_mode == "constant" ? Fill::constant : Fill::reflect),
      interpolation_(std::move(interpolation)),
      fill_value_(fill_value) {
  if (!std::isfinite(lower_) || !std::isfinite(upper_) || lower_ > upper_)
    fail("factor must be a number or a (lower, upper) pair with lower <= upper, got (" + std::to_string(lower_) + ", " +
         std::to_string(upper_) + ")");
  if (fill_ == Fill::reflect && fill_mode != "reflect")
    fail("fill_mode must be \"reflect\", \"wrap\", \"nearest\" or \"constant\", got \"" + fill_mode + "\"");
  if (interpolation_ != "bilinear" && interpolation_ != "nearest")
    fail("interpolation must be \"bilinear\" or \"nearest\", got \"" + interpolation_ + "\"");
  if (!std::isfinite(fill_value_)) fail("fill_value must be finite");
}

const char* RandomRotation::fill_mode() const {
  switch (fill_) {
    case Fill::wrap: return "wrap";
    case Fill::nearest: return "nearest";
    case Fill::constant: return "constant";
    case Fill::reflect: break;
  }
  return "reflect";
}

Shape RandomRotation::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4 && input_shape.rank() != 3)
    fail("expects images [batch, height, width, channels] or one [height, width, channels], got " +
         input_shape.to_string());
  return input_shape;
}

// A coordinate outside [0, size) brought inside as fill_mode says; -1 for "constant".
double RandomRotation::fill_coordinate(double at, std::int64_t size) const {
  const auto len = static_cast<double>(size);
  if (at >= 0 && at <= len - 1) return at;
  if (fill_ == Fill::constant) return -1;
  if (fill_ == Fill::nearest) return std::clamp(at, 0.0, len - 1);
  if (fill_ == Fill::wrap) {
    if (size == 1) return 0;
    const double period = len - 1;  // as TensorFlow's: the last pixel meets the first
    at -= period * std::floor(at / period);
    return std::clamp(at, 0.0, len - 1);
  }
  // reflect: d c b a | a b c d | d c b a
  const double period = 2 * len;
  if (at < 0) {
    if (at < -period) at += period * std::floor(-at / period);
    at = at < -len ? at + period : -at - 1;
  } else {
    at -= period * std::floor(at / period);
    if (at >= len) at = period - at - 1;
  }
  return std::clamp(at, 0.0, len - 1);
}

Tensor RandomRotation::rotate(const Tensor& images, const std::vector<double>& turns) const {
  const Shape s = as_batch(images.shape());
  if (!images.on_cpu()) fail("rotates images on the CPU; the images are on " + images.device().to_string());
  images.check_dtype(DType::f32, "RandomRotation");
  const std::int64_t n = s[0], h = s[1], w = s[2], c = s[3];
  // Each output pixel's (up to) four source pixels and their weights, kept for backward.
  struct Tap {
    std::int64_t pixel;  // into n * h * w; -1: the fill value
    float weight;
  };
  auto taps = std::make_shared<std::vector<Tap>>(static_cast<std::size_t>(n * h * w * 4));
  const bool nearest = interpolation_ == "nearest";
  for (std::int64_t b = 0; b < n; ++b) {
    const double angle = 2 * 3.14159265358979323846 * turns[static_cast<std::size_t>(b)];
    const double cs = std::cos(angle), sn = std::sin(angle);
    // Keras's rotation matrix: output (x, y) reads input (cs x - sn y + dx, sn x + cs y + dy).
    const double dx = ((w - 1) - (cs * (w - 1) - sn * (h - 1))) / 2;
    const double dy = ((h - 1) - (sn * (w - 1) + cs * (h - 1))) / 2;
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x) {
        Tap* t = taps->data() + ((b * h + y) * w + x) * 4;
        for (int k = 0; k < 4; ++k) t[k] = {-1, 0.0f};
        const double sx = fill_coordinate(cs * x - sn * y + dx, w);
        const double sy = fill_coordinate(sn * x + cs * y + dy, h);
        if (sx < 0 || sy < 0) {  // constant fill
          t[0] = {-1, 1.0f};
          continue;
        }
        if (nearest) {
          const auto px = static_cast<std::int64_t>(std::lround(sx)), py = static_cast<std::int64_t>(std::lround(sy));
          t[0] = {(b * h + std::min(py, h - 1)) * w + std::min(px, w - 1), 1.0f};
          continue;
        }
        const auto x0 = static_cast<std::int64_t>(std::floor(sx)), y0 = static_cast<std::int64_t>(std::floor(sy));
        const std::int64_t x1 = std::min(x0 + 1, w - 1), y1 = std::min(y0 + 1, h - 1);
        const auto fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
        t[0] = {(b * h + y0) * w + x0, (1 - fx) * (1 - fy)};
        t[1] = {(b * h + y0) * w + x1, fx * (1 - fy)};
        t[2] = {(b * h + y1) * w + x0, (1 - fx) * fy};
        t[3] = {(b * h + y1) * w + x1, fx * fy};
      }
  }
  Tensor out = Tensor::empty(images.shape());  // the layout of s
  const float* in = images.data<float>();
  float* o = out.data<float>();
  const std::int64_t pixels = n * h * w;
  for (std::int64_t p = 0; p < pixels; ++p) {
    const Tap* t = taps->data() + p * 4;
    for (std::int64_t ch = 0; ch < c; ++ch) {
      float v = 0;
      for (int k = 0; k < 4; ++k)
        if (t[k].weight != 0.0f) v += t[k].weight * (t[k].pixel < 0 ? fill_value_ : in[t[k].pixel * c + ch]);
      o[p * c + ch] = v;
    }
  }
  const Tensor* inputs[] = {&images};
  if (GradientTape::should_record(inputs))
    GradientTape::record(inputs, out, [taps, shape = images.shape(), c, pixels](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = Tensor::zeros(shape);
      float* d = dx.data<float>();
      const float* g = dy.data<float>();
      for (std::int64_t p = 0; p < pixels; ++p) {
        const Tap* t = taps->data() + p * 4;
        for (int k = 0; k < 4; ++k)
          if (t[k].pixel >= 0 && t[k].weight != 0.0f)
            for (std::int64_t ch = 0; ch < c; ++ch) d[t[k].pixel * c + ch] += t[k].weight * g[p * c + ch];
      }
      ctx.add(0, dx);
    });
  return out;
}

Tensor RandomRotation::call(const Tensor& x, bool training) {
  compute_output_shape(x.shape());
  if (!training) return x;
  const std::int64_t n = as_batch(x.shape())[0];
  const Generator g = stream_.draw(static_cast<std::uint64_t>(n));
  std::vector<double> turns(static_cast<std::size_t>(n));
  for (std::int64_t b = 0; b < n; ++b)
    turns[static_cast<std::size_t>(b)] = lower_ + (upper_ - lower_) * g.uniform_at(static_cast<std::uint64_t>(b));
  return rotate(x, turns);
}

}  // namespace dtrain::nn
