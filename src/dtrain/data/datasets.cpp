// Fashion-MNIST loading and synthetic data.
#include "dtrain/data/datasets.h"

#include <cstdlib>
#include <filesystem>
#include <span>
#include <vector>

#include "dtrain/core/rng.h"
#include "dtrain/data/idx.h"

namespace dtrain::data {
namespace {

// The file as named, or with .gz added, whichever exists (the first is preferred).
std::string find_file(const std::string& dir, const std::string& name) {
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  for (const std::string& candidate : {base.string() + ".gz", base.string()})
    if (std::filesystem::exists(candidate)) return candidate;
  DTRAIN_THROW(IoError, base.string(), "[.gz]: not found. Install Debian's dataset-fashion-mnist "
               "(scripts/install-deps.sh does) or point DTRAIN_FASHION_MNIST_DIR at a directory holding it");
}

}  // namespace

std::string fashion_mnist_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  if (const char* env = std::getenv("DTRAIN_FASHION_MNIST_DIR"); env && *env) return env;
  return kFashionMnistDefaultDir;
}

Classification load_fashion_mnist(const std::string& dir_in, DType images) {
  if (images != DType::f32 && images != DType::u8)
    DTRAIN_THROW(InvalidArgument, "load_fashion_mnist: images come as float32 or uint8, not ", dtype_name(images));
  const std::string dir = fashion_mnist_dir(dir_in);
  auto read_images = [&](const std::string& path) {
    return images == DType::u8 ? read_idx_image_bytes(path) : read_idx_images(path);
  };
  Classification c;
  c.classes = 10;
  c.train.x = read_images(find_file(dir, "train-images-idx3-ubyte"));
  c.train.y = read_idx_labels(find_file(dir, "train-labels-idx1-ubyte"), c.classes);
  c.test.x = read_images(find_file(dir, "t10k-images-idx3-ubyte"));
  c.test.y = read_idx_labels(find_file(dir, "t10k-labels-idx1-ubyte"), c.classes);
  for (const Split* s : {&c.train, &c.test})
    if (s->x.dim(0) != s->y.dim(0))
      DTRAIN_THROW(IoError, dir, ": ", s->x.dim(0), " images but ", s->y.dim(0), " labels in the ",
                   s == &c.train ? "train" : "test", " split");
  return c;
}

Split make_synthetic(std::int64_t samples, std::int64_t features, std::int64_t classes, std::uint64_t seed,
                     SyntheticLabels labels) {
  if (samples < 0 || features <= 0 || classes <= 0)
    DTRAIN_THROW(InvalidArgument, "make_synthetic: samples, features and classes must be positive, got ", samples,
                 ", ", features, ", ", classes);
  Generator g(seed);
  Split s;
  s.x = Tensor::empty({samples, features});
  s.y = Tensor::empty({samples}, DType::i32);
  float* x = s.x.data<float>();
  std::int32_t* y = s.y.data<std::int32_t>();
  for (std::int64_t i = 0; i < samples * features; ++i) x[i] = g.normal();
  if (labels == SyntheticLabels::random) {
    for (std::int64_t i = 0; i < samples; ++i) y[i] = static_cast<std::int32_t>(g.below(static_cast<std::uint64_t>(classes)));
    return s;
  }
  Generator teacher = g.fork(1);
  std::vector<float> w(static_cast<size_t>(features * classes));
  for (auto& v : w) v = teacher.normal();
  for (std::int64_t i = 0; i < samples; ++i) {
    std::int32_t best = 0;
    float best_score = 0;
    for (std::int64_t c = 0; c < classes; ++c) {
      float score = 0;
      for (std::int64_t d = 0; d < features; ++d) score += x[i * features + d] * w[d * classes + c];
      if (c == 0 || score > best_score) best_score = score, best = static_cast<std::int32_t>(c);
    }
    y[i] = best;
  }
  return s;
}

namespace {

// The first `limit` bytes of `files` (-1: all), one after the other, and their names.
std::vector<std::uint8_t> read_text(const std::vector<std::string>& files, std::int64_t limit, std::string& names) {
  std::vector<std::uint8_t> text;
  for (const std::string& path : files) {
    if (limit >= 0 && static_cast<std::int64_t>(text.size()) >= limit) break;
    const std::vector<std::uint8_t> part =
        read_file_bytes(path, limit < 0 ? -1 : limit - static_cast<std::int64_t>(text.size()));
    text.insert(text.end(), part.begin(), part.end());
    names += (names.empty() ? "" : ", ") + path;
  }
  return text;
}

// `count` windows of length + 1 values side by side from the start of `ids` (byte values
// or token ids): each gives its first `length` values (x) and the `length` after its first (y).
Split windows_of(std::span<const std::int32_t> ids, std::int64_t length, std::int64_t count) {
  Split s{Tensor::empty(Shape{count, length}), Tensor::empty(Shape{count, length}, DType::i32)};
  float* x = s.x.data<float>();
  std::int32_t* y = s.y.data<std::int32_t>();
  for (std::int64_t w = 0; w < count; ++w)
    for (std::int64_t t = 0; t < length; ++t) {
      const auto at = static_cast<std::size_t>(w * length + t);
      x[w * length + t] = static_cast<float>(ids[at]);
      y[w * length + t] = ids[at + 1];
    }
  return s;
}

void check_text_windows(const char* who, std::int64_t length, double held_out) {
  if (length <= 0) DTRAIN_THROW(InvalidArgument, who, ": the window length must be positive, got ", length);
  if (!(held_out >= 0.0 && held_out < 1.0)) DTRAIN_THROW(InvalidArgument, who, ": held_out must be in [0, 1), got ", held_out);
}

}  // namespace

Classification text_windows(const std::vector<std::string>& files, std::int64_t length, std::int64_t limit,
                            double held_out) {
  if (files.empty()) DTRAIN_THROW(InvalidArgument, "text_windows: no files given");
  check_text_windows("text_windows", length, held_out);
  std::string names;
  const std::vector<std::uint8_t> text = read_text(files, limit, names);
  const std::int64_t windows = (static_cast<std::int64_t>(text.size()) - 1) / length;
  const auto test = static_cast<std::int64_t>(static_cast<double>(windows) * held_out);
  if (windows - test < 1 || (held_out > 0.0 && test < 1))
    DTRAIN_THROW(InvalidArgument, "text_windows: ", text.size(), " bytes of ", names, " make ", windows,
                 " window(s) of ", length, " bytes, too few for a training split and a held-out share of ", held_out);
  const std::vector<std::int32_t> ids(text.begin(), text.end());
  Classification out;
  out.classes = 256;
  out.train = windows_of(ids, length, windows - test);
  if (test > 0) out.test = windows_of(std::span(ids).subspan(static_cast<std::size_t>((windows - test) * length)), length, test);
  return out;
}

Classification token_windows(const std::vector<std::string>& files, std::int64_t length, std::int64_t limit,
                             double held_out, const std::function<SentencePiece(const Dataset& lines)>& tokenizer) {
  if (files.empty()) DTRAIN_THROW(InvalidArgument, "token_windows: no files given");
  check_text_windows("token_windows", length, held_out);
  std::string names;
  const std::vector<std::uint8_t> text = read_text(files, limit, names);
  // The lines of each split, the held-out one starting after the line end nearest its share.
  auto cut = static_cast<std::size_t>(static_cast<double>(text.size()) * (1.0 - held_out));
  while (held_out > 0.0 && cut < text.size() && cut > 0 && text[cut - 1] != '\n') ++cut;
  auto lines_of = [&](std::size_t begin, std::size_t end) {
    std::vector<std::string> lines;
    for (std::size_t at = begin; at < end;) {
      std::size_t stop = at;
      while (stop < end && text[stop] != '\n') ++stop;
      lines.emplace_back(reinterpret_cast<const char*>(text.data()) + at, stop - at);
      at = stop + 1;
    }
    return lines;
  };
  if (held_out > 0.0 && cut >= text.size())
    DTRAIN_THROW(InvalidArgument, "token_windows: ", names, " has no line end after ", (1.0 - held_out) * 100,
                 "% of its ", text.size(), " bytes: the held-out share is made of whole lines");
  std::vector<std::string> train_lines = lines_of(0, cut), test_lines = lines_of(cut, text.size());
  const auto line_count = static_cast<std::int64_t>(train_lines.size());
  const SentencePiece sp = tokenizer(Dataset::from_tensor_slices({Tensor::from_vector({line_count}, train_lines)}));
  // Each split's ids, line after line; its windows are its own, so that no held-out id is
  // trained on.
  auto ids_of = [&](const std::vector<std::string>& lines) {
    std::vector<std::int32_t> ids;
    for (const std::string& line : lines) {
      const std::vector<std::int32_t> piece_ids = sp.encode(line);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
    return ids;
  };
  const std::vector<std::int32_t> train_ids = ids_of(train_lines), test_ids = ids_of(test_lines);
  auto windows_in = [&](const std::vector<std::int32_t>& ids) {
    return ids.empty() ? std::int64_t{0} : (static_cast<std::int64_t>(ids.size()) - 1) / length;
  };
  const std::int64_t train = windows_in(train_ids), test = held_out > 0.0 ? windows_in(test_ids) : 0;
  if (train < 1 || (held_out > 0.0 && test < 1))
    DTRAIN_THROW(InvalidArgument, "token_windows: ", text.size(), " bytes of ", names, " make ", train_ids.size(),
                 " training and ", test_ids.size(), " held-out tokens: ", train, " and ", test, " window(s) of ", length,
                 ", too few for a training split and a held-out share of ", held_out);
  Classification out;
  out.classes = sp.vocab_size();
  out.train = windows_of(train_ids, length, train);
  if (test > 0) out.test = windows_of(test_ids, length, test);
  // The split the figures are of: the held-out one where there is one.
  out.bytes_per_token = test > 0 ? static_cast<double>(text.size() - cut) / static_cast<double>(test_ids.size())
                                 : static_cast<double>(cut) / static_cast<double>(train_ids.size());
  return out;
}

}  // namespace dtrain::data
