"""keras_hub's names for what dtrain has of it: ``import dtrain.keras_hub as keras_hub``.

- tokenizers.SentencePieceTokenizer and tokenizers.compute_sentence_piece_proto: subword
  tokens through Debian's libsentencepiece, trained by dtrain's pipeline.
- layers.PositionEmbedding: learned position vectors.
"""
from . import layers, tokenizers

__all__ = ["layers", "tokenizers"]
