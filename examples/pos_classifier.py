"""An encoder classifier: a small transformer (byte embedding and learned positions,
pre-norm blocks of bidirectional multi-head attention and a GELU feed-forward, a mean over
positions; the padding after a short definition is masked, Embedding(mask_zero=True)) that reads the start of a dictionary definition and tells the headword's part
of speech: noun, adjective, verb or adverb. The entries come from Debian's GNU
Collaborative International Dictionary of English (dict-gcide, read where the package
installs it: scripts/install-deps.sh --corpora); the last tenth of them (in the
dictionary's order) is held out. It reports the held-out loss and accuracy.

    PYTHONPATH=build/release/python python3 examples/pos_classifier.py [--bytes 4000000]
        [--epochs 4] [--length 96]
"""
import argparse
import gzip
import re
import sys

import numpy as np

import dtrain as tf
from char_lm import transformer

DICTIONARY = "/usr/share/dictd/gcide.dict.dz"
CLASSES = ["noun", "adjective", "verb", "adverb"]
# "Abdicator \Ab"di*ca`tor\, n." — the part of speech after the pronunciation.
HEAD = re.compile(r"^\S.*?\\[^\\]*\\, (n|a|v\. [ti]|adv)\.")
LABEL = {"n": 0, "a": 1, "v. t": 2, "v. i": 2, "adv": 3}


def entries(text):
    """(definition, class) pairs: each entry's text after its first line, without the
    bracketed etymologies and sources, its whitespace collapsed."""
    out = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        match = HEAD.match(lines[0]) if lines else None
        if not match:
            continue
        # Etymologies may begin on the first line and end on a later one.
        body = re.sub(r"\[[^\]]*\]", " ", " ".join([lines[0][match.end():]] + lines[1:]))
        body = re.sub(r"\s+", " ", body).strip()
        if len(body) >= 16:
            out.append((body, LABEL[match.group(1)]))
    return out


def encode(pairs, length):
    """Bytes of each definition, cut or padded with zeros (no byte of the text) to `length`,
    and the classes."""
    x = np.zeros((len(pairs), length), np.int32)
    for i, (body, _) in enumerate(pairs):
        raw = np.frombuffer(body.encode("utf-8", errors="replace")[:length], np.uint8)
        x[i, :len(raw)] = raw
    return x, np.array([label for _, label in pairs], np.int32)


def encoder_classifier(length, width=96, heads=4, blocks=2, vocabulary=256):
    ids = tf.keras.Input(shape=(length,), dtype="int32", name="bytes")
    # Padding (id 0) is masked: attention and the mean over positions read real bytes only.
    x = transformer(ids, length, width, heads, blocks, vocabulary, causal=False, mask_zero=True)
    x = tf.keras.layers.GlobalAveragePooling1D()(x)
    return tf.keras.Model(ids, tf.keras.layers.Dense(len(CLASSES))(x), name="pos_classifier")


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--bytes", type=int, default=4_000_000, help="this much of the dictionary")
    a.add_argument("--length", type=int, default=96)
    a.add_argument("--epochs", type=int, default=4)
    a.add_argument("--batch", type=int, default=32)
    args = a.parse_args()
    try:
        with gzip.open(DICTIONARY, "rb") as f:
            text = f.read(args.bytes).decode("utf-8", errors="replace")
    except OSError as e:
        sys.exit(f"pos_classifier: cannot read {DICTIONARY} ({e}); install dict-gcide "
                 "(scripts/install-deps.sh --corpora)")
    pairs = entries(text)
    held_out = len(pairs) // 10
    x, y = encode(pairs, args.length)
    counts = np.bincount(y, minlength=len(CLASSES))
    print(f"{len(pairs)} definitions ({', '.join(f'{c} {n}' for c, n in zip(CLASSES, counts))}); "
          f"{held_out} held out")
    tf.keras.utils.set_random_seed(0)
    model = encoder_classifier(args.length)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x[:-held_out], y[:-held_out], batch_size=args.batch, epochs=args.epochs,
              validation_data=(x[-held_out:], y[-held_out:]), verbose=2)
    logs = model.evaluate(x[-held_out:], y[-held_out:], verbose=0, return_dict=True)
    majority = counts[:].max() / counts.sum()
    print(f"held-out loss {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f} "
          f"(always the commonest class: {majority:.4f})")


if __name__ == "__main__":
    main()
