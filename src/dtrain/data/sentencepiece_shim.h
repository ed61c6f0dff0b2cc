// The interface between dtrain and libdtrain_sentencepiece, the small library that holds
// libsentencepiece. Debian's libsentencepiece carries its own copy of protobuf (3.14) and
// exports it; in a process that holds libprotobuf (gRPC's, 3.21) it would bind to that one
// and abort. So dtrain opens it apart (RTLD_LOCAL | RTLD_DEEPBIND: its own symbols first)
// and reaches it only through these functions. Errors come back as text, not exceptions
// (each function catches what it would throw).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dtrain::data::detail {

struct SentencePieceApi {
  int version;  // kSentencePieceApiVersion of the library that made it
  // Trains with SentencePiece's flags; next(sentence) gives the next sentence, false after
  // the last. Fills `proto` (the serialized model) or `error`.
  // `seed` seeds SentencePiece's sampling of the sentences, so that every process that
  // trains on the same text gets the same pieces.
  bool (*train)(const std::unordered_map<std::string, std::string>& flags, bool (*next)(void* state, std::string* sentence),
                void* state, unsigned seed, std::string* proto, std::string* error);
  void* (*load)(const std::string& proto, std::string* error);  // a processor, or null and `error`
  void (*free)(void* processor);
  bool (*encode)(const void* processor, std::string_view text, std::vector<int>* ids, std::string* error);
  bool (*encode_pieces)(const void* processor, std::string_view text, std::vector<std::string>* pieces,
                        std::string* error);
  bool (*decode)(const void* processor, const std::vector<int>& ids, std::string* text, std::string* error);
  int (*size)(const void* processor);
  void (*id_to_piece)(const void* processor, int id, std::string* piece);
  int (*piece_to_id)(const void* processor, std::string_view piece);
  // unk, bos, eos and pad ids (-1 where the model has none).
  void (*special_ids)(const void* processor, int ids[4]);
};

inline constexpr int kSentencePieceApiVersion = 2;

}  // namespace dtrain::data::detail

// What libdtrain_sentencepiece exports.
extern "C" const dtrain::data::detail::SentencePieceApi* dtrain_sentencepiece_api();
