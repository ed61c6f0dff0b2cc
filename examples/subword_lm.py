"""A subword language model: the character model's transformer (examples/char_lm.py) over
SentencePiece pieces instead of bytes. The pipeline reads the dictionary's lines
(tf.data.TextLineDataset, which reads its gzip-compatible .dz as GZIP), trains a
SentencePiece model on the training lines (keras_hub's compute_sentence_piece_proto),
turns the text into ids, and trains on windows of them. It reports the held-out loss in
bits per byte of text, the character model's unit, and samples text.

    PYTHONPATH=build/release/python python3 examples/subword_lm.py [--bytes 2000000] [--vocabulary 2000]
        [--model-type unigram] [--epochs 3] [--length 64] [--generate 60]
"""
import argparse
import math
import os
import sys

import numpy as np

import dtrain as tf
import dtrain.keras_hub as keras_hub
from char_lm import language_model, sample, windows

GCIDE = "/usr/share/dictd/gcide.dict.dz"


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--bytes", type=int, default=2_000_000, help="the dictionary's first lines up to this many bytes")
    a.add_argument("--vocabulary", type=int, default=2000)
    a.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    a.add_argument("--length", type=int, default=64, help="tokens a window holds")
    a.add_argument("--batch", type=int, default=32)
    a.add_argument("--epochs", type=int, default=3)
    a.add_argument("--generate", type=int, default=60, help="tokens to sample")
    a.add_argument("--temperature", type=float, default=0.8)
    args = a.parse_args()
    if not os.path.exists(GCIDE):
        sys.exit(f"subword_lm: {GCIDE} is missing; install dict-gcide (scripts/install-deps.sh --corpora)")
    text, size = [], 0
    for line in tf.data.TextLineDataset(GCIDE, compression_type="GZIP").as_numpy_iterator():
        if size >= args.bytes:
            break
        text.append(line)
        size += len(line) + 1
    # The last tenth of the bytes is held out, as examples/char_lm.py holds it out.
    split = int(np.searchsorted(np.cumsum([len(t) + 1 for t in text]), size * 0.9))
    train_lines = tf.data.Dataset.from_tensor_slices(np.array(text[:split], dtype=object))
    test_lines = tf.data.Dataset.from_tensor_slices(np.array(text[split:], dtype=object))
    proto = keras_hub.tokenizers.compute_sentence_piece_proto(train_lines, args.vocabulary,
                                                              model_type=args.model_type)
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto)

    def stream(dataset):
        """The lines' ids one after the other, and the bytes of the lines (with their ends)."""
        parts, size = [], 0
        for batch in dataset.batch(1000):
            ids = tokenizer(batch).numpy()
            parts.append(ids[ids != 0])  # 0 is the padding, never a piece of the text
            size += sum(len(line) + 1 for line in batch.numpy())
        return np.concatenate(parts), size

    train, _ = stream(train_lines)
    test, test_bytes = stream(test_lines)
    print(f"{len(train)} tokens to train on, {len(test)} held out ({test_bytes} bytes, "
          f"{test_bytes / len(test):.2f} bytes a token)")
    tf.keras.utils.set_random_seed(0)
    model = language_model(args.length, vocabulary=tokenizer.vocabulary_size())
    model.compile(optimizer=tf.keras.optimizers.Adam(3e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    held = windows(test, args.length, args.batch, shuffle=False)
    model.fit(windows(train, args.length, args.batch, shuffle=True), epochs=args.epochs, validation_data=held, verbose=2)
    nats = model.evaluate(held, verbose=0, return_dict=True)["loss"]
    # Nats per token over the windows evaluated, as bits per byte of the text they cover.
    evaluated = (len(test) - 1) // (args.length + 1) // args.batch * args.batch * args.length
    print(f"held-out loss {nats:.4f} nats per token, "
          f"{nats / math.log(2) * len(test) / test_bytes:.3f} bits per byte ({evaluated} tokens evaluated)")
    if args.generate > 0:
        ids = sample(model, tokenizer("The").numpy(), args.generate, args.length, args.temperature, fill=0)
        print(tokenizer.detokenize(ids).numpy().decode("utf-8", errors="replace"))

if __name__ == "__main__":
    main()
