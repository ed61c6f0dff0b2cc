// Ready-made datasets: Fashion-MNIST from Debian's dataset-fashion-mnist package, and
// synthetic data like the seeds' examples (normal inputs, integer labels, fixed seed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dtrain/core/tensor.h"
#include "dtrain/data/dataset.h"
#include "dtrain/data/sentencepiece.h"

namespace dtrain::data {

struct Split {
  Tensor x;  // float32 (or uint8 images) [count, features]
  Tensor y;  // int32 [count]
};

struct Classification {
  Split train;
  Split test;  // may be empty (undefined tensors)
  std::int64_t classes = 0;
  // Text: the test split's bytes per token, which turns a loss per token into one per byte
  // (1 where the tokens are bytes).
  double bytes_per_token = 1.0;
};

// Where Debian installs the files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

// The directory to read: `dir` if not empty, else $DTRAIN_FASHION_MNIST_DIR, else Debian's.
std::string fashion_mnist_dir(const std::string& dir = "");

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]: 60000 + 10000 images of 28x28
// as [n, 784] floats in [0, 1] (images = f32), or as the stored bytes 0..255 (images = u8,
// for a model starting with nn::Rescaling(1.0f / 255)); labels 0..9. Errors name the file.
Classification load_fashion_mnist(const std::string& dir = "", DType images = DType::f32);

enum class SyntheticLabels {
  random,   // uniform in [0, classes): what the seeds' examples use; not learnable
  teacher,  // arg-max of a fixed random linear map of the input: learnable
};

// `samples` rows of standard-normal inputs with `features` columns and integer labels.
Split make_synthetic(std::int64_t samples, std::int64_t features, std::int64_t classes, std::uint64_t seed,
                     SyntheticLabels labels = SyntheticLabels::random);

// A language model's data from text: the first `limit` bytes of `files`, one after the other
// (gzip where they are), cut into windows of `length` bytes (x, float32 [count, length],
// byte values) and the bytes that follow each (y, int32 [count, length]: x shifted by one),
// the last `held_out` share of the windows as the test split; 256 classes. A text too
// short for one window of each split is an InvalidArgument naming the files and the sizes.
Classification text_windows(const std::vector<std::string>& files, std::int64_t length, std::int64_t limit = -1,
                            double held_out = 0.1);

// The same over subword tokens: the text is cut at the line end nearest the held-out share
// of its bytes; `tokenizer` gets the training lines (a dataset of string scalars, to train
// on or to ignore) and gives the SentencePiece that turns each split into ids, line by line
// (windows of `length` ids; float32 x, int32 y). classes: its vocabulary; bytes_per_token:
// the test split's bytes over its ids.
Classification token_windows(const std::vector<std::string>& files, std::int64_t length, std::int64_t limit,
                             double held_out, const std::function<SentencePiece(const Dataset& lines)>& tokenizer);

}  // namespace dtrain::data
