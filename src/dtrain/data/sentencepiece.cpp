// SentencePiece through libdtrain_sentencepiece (sentencepiece_shim.h): training from a
// dataset's strings, encoding and decoding.
#include "dtrain/data/sentencepiece.h"

#include <dlfcn.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "dtrain/core/files.h"
#include "dtrain/core/threads.h"
#include "dtrain/data/sentencepiece_shim.h"

namespace dtrain::data {

namespace {

using detail::SentencePieceApi;

// The library, opened at the first use. Where it cannot be, the error says why.
const SentencePieceApi& api() {
  static std::once_flag once;
  static const SentencePieceApi* found = nullptr;
  static std::string why;
  std::call_once(once, [] {
    if constexpr (DTRAIN_SANITIZED) {
      // The sanitizers' runtimes refuse RTLD_DEEPBIND, which the library needs.
      why = "SentencePiece is not available in a sanitizer build (its library must be opened with RTLD_DEEPBIND)";
      return;
    }
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("DTRAIN_SENTENCEPIECE_LIBRARY")) candidates.emplace_back(env);
    candidates.emplace_back(DTRAIN_SENTENCEPIECE_BUILT);
    candidates.emplace_back(DTRAIN_SENTENCEPIECE_INSTALLED);
    for (const std::string& path : candidates) {
      if (!std::filesystem::exists(path)) {
        why += (why.empty() ? "" : "; ") + path + ": not found";
        continue;
      }
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (!handle) {
        why += (why.empty() ? "" : "; ") + std::string(dlerror());
        continue;
      }
      using Get = const SentencePieceApi* (*)();
      const auto get = reinterpret_cast<Get>(dlsym(handle, "dtrain_sentencepiece_api"));
      if (!get || get()->version != detail::kSentencePieceApiVersion) {
        why += (why.empty() ? "" : "; ") + path + ": not this dtrain's SentencePiece library";
        dlclose(handle);
        continue;
      }
      found = get();
      return;
    }
  });
  if (!found)
    DTRAIN_THROW(Unavailable, "SentencePiece: ", why,
                 " (libdtrain_sentencepiece is built with dtrain; DTRAIN_SENTENCEPIECE_LIBRARY names another place)");
  return *found;
}

// A processor the library made, freed by it.
struct Loaded {
  void* processor = nullptr;
  ~Loaded() {
    if (processor) api().free(processor);
  }
};

// The strings of a dataset's elements, one at a time, for the trainer. An error of the
// pipeline ends the iteration and is thrown again once training returns.
struct DatasetSentences {
  explicit DatasetSentences(const Dataset& ds) : it(ds.make_iterator()) {}
  Iterator it;
  std::vector<std::string> current;
  std::size_t next = 0;
  std::int64_t elements = 0;
  std::exception_ptr error;

  static bool take(void* self, std::string* sentence) { return static_cast<DatasetSentences*>(self)->take(*sentence); }
  bool take(std::string& sentence) {
    if (error) return false;
    try {
      while (next >= current.size()) {
        auto e = it.next();
        if (!e) return false;
        if (e->size() != 1 || (*e)[0].dtype() != DType::string)
          DTRAIN_THROW(InvalidArgument, "SentencePiece::train: element ", elements, " of the dataset is not one string ",
                       "tensor (", e->size(), " component(s)", e->empty() ? "" : ", the first ",
                       e->empty() ? "" : std::string(dtype_name((*e)[0].dtype())), "); map it to the text alone first");
        ++elements;
        const Tensor& t = (*e)[0];
        current.assign(t.data<std::string>(), t.data<std::string>() + t.numel());
        next = 0;
      }
      sentence = std::move(current[next++]);
      return true;
    } catch (...) {
      error = std::current_exception();
      return false;
    }
  }
};

std::string number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

struct SentencePiece::Impl {
  Loaded loaded;
  const void* processor() const { return loaded.processor; }
};

SentencePiece::SentencePiece(std::string proto) : proto_(std::move(proto)) {
  auto impl = std::make_shared<Impl>();
  std::string error;
  impl->loaded.processor = api().load(proto_, &error);
  if (!impl->loaded.processor) DTRAIN_THROW(InvalidArgument, "SentencePiece: not a model SentencePiece can load (", error, ")");
  impl_ = std::move(impl);
}

SentencePiece SentencePiece::train(const Dataset& sentences, const SentencePieceOptions& o) {
  if (o.vocab_size < 2) DTRAIN_THROW(InvalidArgument, "SentencePiece::train: vocab_size must be at least 2, got ", o.vocab_size);
  std::unordered_map<std::string, std::string> flags{
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"character_coverage", number(o.character_coverage)},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"normalization_rule_name", o.lowercase ? "nmt_nfkc_cf" : "nmt_nfkc"},
      {"num_threads", std::to_string(std::max(1, available_cores()))},
      {"minloglevel", "2"},  // errors only: the trainer's progress is not the job's output
      // Padding is id 0, so that a batch padded with zeros decodes to its text.
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
  };
  for (const auto& [key, value] : o.extra) flags[key] = value;
  const SentencePieceApi& lib = api();
  DatasetSentences input(sentences);
  std::string proto, error;
  const bool ok = lib.train(flags, &DatasetSentences::take, &input, o.seed, &proto, &error);
  if (input.error) std::rethrow_exception(input.error);
  if (!ok) DTRAIN_THROW(InvalidArgument, "SentencePiece::train: ", error);
  return SentencePiece(std::move(proto));
}

SentencePiece SentencePiece::from_bytes(std::string_view proto) { return SentencePiece(std::string(proto)); }

SentencePiece SentencePiece::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DTRAIN_THROW(IoError, path, ": cannot open the SentencePiece model");
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  try {
    return SentencePiece(std::move(bytes));
  } catch (const InvalidArgument& e) {
    DTRAIN_THROW(IoError, path, ": ", e.what());
  }
}

void SentencePiece::save(const std::string& path) const {
  write_file_replacing(path, proto_, "the SentencePiece model");  // whole or not at all, for readers
}

std::vector<std::int32_t> SentencePiece::encode(std::string_view text) const {
  std::vector<int> ids;
  std::string error;
  if (!api().encode(impl_->processor(), text, &ids, &error)) DTRAIN_THROW(InvalidArgument, "SentencePiece::encode: ", error);
  return {ids.begin(), ids.end()};
}

std::vector<std::string> SentencePiece::encode_pieces(std::string_view text) const {
  std::vector<std::string> pieces;
  std::string error;
  if (!api().encode_pieces(impl_->processor(), text, &pieces, &error))
    DTRAIN_THROW(InvalidArgument, "SentencePiece::encode_pieces: ", error);
  return pieces;
}

std::string SentencePiece::decode(std::span<const std::int32_t> ids) const {
  const int n = vocab_size();
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= n)
      DTRAIN_THROW(InvalidArgument, "SentencePiece::decode: id ", ids[i], " at position ", i,
                   " is outside the vocabulary [0, ", n, ")");
  std::string text, error;
  if (!api().decode(impl_->processor(), std::vector<int>(ids.begin(), ids.end()), &text, &error))
    DTRAIN_THROW(InvalidArgument, "SentencePiece::decode: ", error);
  return text;
}

int SentencePiece::vocab_size() const { return api().size(impl_->processor()); }

std::string SentencePiece::id_to_piece(int id) const {
  if (id < 0 || id >= vocab_size())
    DTRAIN_THROW(InvalidArgument, "SentencePiece: id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  std::string piece;
  api().id_to_piece(impl_->processor(), id, &piece);
  return piece;
}

int SentencePiece::piece_to_id(std::string_view piece) const { return api().piece_to_id(impl_->processor(), piece); }

int SentencePiece::special_id(int which) const {
  int ids[4];
  api().special_ids(impl_->processor(), ids);
  return ids[which];
}

}  // namespace dtrain::data
