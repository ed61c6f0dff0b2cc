// SentencePiece trained from a dataset of text lines: ids and back, the model's bytes,
// and errors that name what was wrong.
#include <gtest/gtest.h>

#include <fstream>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/data/sentencepiece.h"

namespace dtrain::data {
namespace {

using testing::message_of;

class SentencePieceTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    if (DTRAIN_SANITIZED) GTEST_SKIP() << "SentencePiece's library needs RTLD_DEEPBIND, which the sanitizers refuse";
    TempDirTest::SetUp();
  }
  // Lines of made-up words of recurring syllables, enough for a vocabulary of 80.
  std::string corpus() {
    static const char* syllables[] = {"ka", "lo", "mi", "ren", "tu", "sha", "vel", "dor", "pi", "ne", "qua", "zim"};
    std::string text;
    for (int line = 0; line < 600; ++line) {
      for (int w = 0; w < 8; ++w) {
        const int a = (line * 5 + w * 7) % 12, b = (line + w * w) % 12, c = (line / 3 + w) % 5;
        text += std::string(w ? " " : "") + syllables[a] + syllables[b] + (c < 2 ? syllables[(a + b) % 12] : "");
      }
      text += line % 3 ? ".\n" : ", said Ada.\n";
    }
    return write("corpus.txt", text);
  }
};

TEST_F(SentencePieceTest, TrainedOnTextLinesItEncodesAndDecodesEveryLineBack) {
  const std::string path = corpus();
  for (const char* type : {"unigram", "bpe"}) {
    const SentencePiece sp = SentencePiece::train(Dataset::text_lines({path}), {.vocab_size = 80, .model_type = type});
    EXPECT_EQ(sp.vocab_size(), 80) << type;
    std::string line;
    std::ifstream in(path);
    for (int i = 0; i < 4; ++i) std::getline(in, line);  // a line of the text, ", said Ada." at its end
    const std::vector<std::int32_t> ids = sp.encode(line);
    EXPECT_LT(ids.size(), line.size() / 2) << type << ": subwords, not characters";
    EXPECT_EQ(sp.decode(ids), line) << type;
    // The pieces are the line, "\u2581" marking where each word starts.
    std::string joined, marked = "\xE2\x96\x81";
    for (const std::string& piece : sp.encode_pieces(line)) joined += piece;
    for (char ch : line) marked += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
    EXPECT_EQ(joined, marked) << type;
    EXPECT_EQ(sp.piece_to_id(sp.id_to_piece(ids[0])), ids[0]) << type;
    // The model's bytes load again into the same tokenizer, from memory and from a file.
    const std::string file = (dir_ / (std::string(type) + ".model")).string();
    sp.save(file);
    EXPECT_EQ(SentencePiece::load(file).encode(line), ids) << type;
    EXPECT_EQ(SentencePiece::from_bytes(sp.serialized()).encode(line), ids) << type;
  }
}

TEST_F(SentencePieceTest, ErrorsNameTheModelTheIdOrTheElement) {
  const SentencePiece sp = SentencePiece::train(Dataset::text_lines({corpus()}), {.vocab_size = 40});
  std::string m = message_of<InvalidArgument>([&] { sp.decode(std::vector<std::int32_t>{5, 40}); });
  EXPECT_NE(m.find("id 40 at position 1 is outside the vocabulary [0, 40)"), std::string::npos) << m;
  m = message_of<InvalidArgument>([&] { (void)sp.id_to_piece(-1); });
  EXPECT_NE(m.find("id -1"), std::string::npos) << m;
  m = message_of<IoError>([&] { SentencePiece::load(write("bad.model", "not a model")); });
  EXPECT_NE(m.find("bad.model: SentencePiece: not a model SentencePiece can load"), std::string::npos) << m;
  const Dataset numbers = Dataset::range(3);
  m = message_of<InvalidArgument>([&] { SentencePiece::train(numbers, {.vocab_size = 10}); });
  EXPECT_NE(m.find("element 0 of the dataset is not one string tensor (1 component(s), the first int32)"),
            std::string::npos) << m;
  m = message_of<InvalidArgument>([&] {
    SentencePiece::train(Dataset::text_lines({corpus()}), {.vocab_size = 40, .model_type = "nonsense"});
  });
  EXPECT_NE(m.find("SentencePiece::train"), std::string::npos) << m;
  // More pieces than the text has: SentencePiece's own words, passed on.
  m = message_of<InvalidArgument>([&] { SentencePiece::train(Dataset::text_lines({write("tiny.txt", "ab\n")}), {.vocab_size = 5000}); });
  EXPECT_NE(m.find("SentencePiece::train: "), std::string::npos) << m;
}

}  // namespace
}  // namespace dtrain::data
