// libdtrain_sentencepiece: libsentencepiece behind sentencepiece_shim.h.
#include "dtrain/data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <memory>

namespace {

using Processor = sentencepiece::SentencePieceProcessor;

const Processor& of(const void* p) { return *static_cast<const Processor*>(p); }

bool failed(const sentencepiece::util::Status& s, std::string* error) {
  if (s.ok()) return false;
  *error = s.ToString();
  return true;
}

class Sentences : public sentencepiece::SentenceIterator {
 public:
  Sentences(bool (*next)(void*, std::string*), void* state) : next_(next), state_(state) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = done_ || !next_(state_, &value_); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  bool (*next_)(void*, std::string*);
  void* state_;
  std::string value_;
  bool done_ = false;
};

// Runs fn; what it throws comes back as `error` (nothing crosses the library's edge).
template <typename Fn>
bool guarded(std::string* error, Fn fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    *error = e.what();
  } catch (...) {
    *error = "an unknown error";
  }
  return false;
}

const dtrain::data::detail::SentencePieceApi kApi{
    dtrain::data::detail::kSentencePieceApiVersion,
    [](const std::unordered_map<std::string, std::string>& flags, bool (*next)(void*, std::string*), void* state,
       unsigned seed, std::string* proto, std::string* error) {
      return guarded(error, [&] {
        sentencepiece::SetRandomGeneratorSeed(seed);
        Sentences sentences(next, state);
        return !failed(sentencepiece::SentencePieceTrainer::Train(flags, &sentences, proto), error);
      });
    },
    [](const std::string& proto, std::string* error) -> void* {
      Processor* made = nullptr;
      guarded(error, [&] {
        auto p = std::make_unique<Processor>();
        if (failed(p->LoadFromSerializedProto(proto), error)) return false;
        made = p.release();
        return true;
      });
      return made;
    },
    [](void* p) { delete static_cast<Processor*>(p); },
    [](const void* p, std::string_view text, std::vector<int>* ids, std::string* error) {
      return guarded(error, [&] { return !failed(of(p).Encode(text, ids), error); });
    },
    [](const void* p, std::string_view text, std::vector<std::string>* pieces, std::string* error) {
      return guarded(error, [&] { return !failed(of(p).Encode(text, pieces), error); });
    },
    [](const void* p, const std::vector<int>& ids, std::string* text, std::string* error) {
      return guarded(error, [&] { return !failed(of(p).Decode(ids, text), error); });
    },
    [](const void* p) { return of(p).GetPieceSize(); },
    [](const void* p, int id, std::string* piece) { *piece = of(p).IdToPiece(id); },
    [](const void* p, std::string_view piece) { return of(p).PieceToId(piece); },
    [](const void* p, int ids[4]) {
      ids[0] = of(p).unk_id();
      ids[1] = of(p).bos_id();
      ids[2] = of(p).eos_id();
      ids[3] = of(p).pad_id();
    },
};

}  // namespace

extern "C" const dtrain::data::detail::SentencePieceApi* dtrain_sentencepiece_api() { return &kApi; }
