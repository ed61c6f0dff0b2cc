// SentencePiece: a subword tokenizer (Kudo and Richardson, 2018) through Debian's
// libsentencepiece (opened apart, see sentencepiece_shim.h), trained on the strings of a Dataset or of text files, and applied to
// text: strings to int32 ids and back. The model is SentencePiece's own serialized proto,
// so one trained here loads in any other SentencePiece (Python's, tensorflow_text's,
// keras_hub's) and the other way round.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/data/dataset.h"

namespace dtrain::data {

struct SentencePieceOptions {
  int vocab_size = 8000;
  std::string model_type = "unigram";  // "unigram", "bpe", "char" or "word"
  double character_coverage = 0.9995;  // of the characters seen, the share the vocabulary must cover
  // At most this many sentences (strings) are read for training; 0: every one.
  std::int64_t max_sentences = 1000000;
  bool lowercase = false;  // the normalizer folds case ("nmt_nfkc_cf" instead of "nmt_nfkc")
  // Any other trainer flag, by SentencePiece's name (user_defined_symbols, ...). The ids
  // of the special pieces are pad 0, unk 1, bos 2 and eos 3 unless given here
  // (pad_id = "-1": no padding piece).
  std::map<std::string, std::string> extra;
  // Seeds the sampling of max_sentences from more: the same text and seed, the same pieces.
  unsigned seed = 1;
};

class SentencePiece {
 public:
  // Trains on the strings of `sentences` (elements holding one string tensor, of any shape:
  // each string a sentence). The error names the flag SentencePiece refused, or the
  // dataset's element that is not a string.
  static SentencePiece train(const Dataset& sentences, const SentencePieceOptions& options = {});
  // A serialized model (a .model file's bytes), as train() and save() make them.
  static SentencePiece from_bytes(std::string_view proto);
  static SentencePiece load(const std::string& path);

  const std::string& serialized() const { return proto_; }
  void save(const std::string& path) const;

  std::vector<std::int32_t> encode(std::string_view text) const;
  std::vector<std::string> encode_pieces(std::string_view text) const;
  std::string decode(std::span<const std::int32_t> ids) const;

  int vocab_size() const;
  std::string id_to_piece(int id) const;  // InvalidArgument past the vocabulary
  int piece_to_id(std::string_view piece) const;  // the unknown id where the piece is not one
  int unk_id() const { return special_id(0); }
  int bos_id() const { return special_id(1); }  // -1 where the model has none
  int eos_id() const { return special_id(2); }
  int pad_id() const { return special_id(3); }

 private:
  struct Impl;
  int special_id(int which) const;
  explicit SentencePiece(std::string proto);
  std::string proto_;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace dtrain::data
