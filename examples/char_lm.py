"""A character-level language model: a small decoder-only transformer (byte embedding and
learned positions, pre-norm blocks of causal multi-head attention and a GELU feed-forward)
trained on a text file, as TensorFlow's text-generation tutorial trains one. It reports
bits per character on held-out text (the last tenth of the file) and samples text.

Corpora from Debian packages, read where they install them (nothing is downloaded):
--corpus gcide (the default) takes the first --bytes of the GNU Collaborative International
Dictionary of English (dict-gcide: /usr/share/dictd/gcide.dict.dz, 40 MB of text);
--corpus fortunes the fortune cookies of fortunes-min (/usr/share/games/fortunes: 98 kB);
--files any text files.

    PYTHONPATH=build/release/python python3 examples/char_lm.py [--corpus gcide] [--bytes 2000000]
        [--epochs 3] [--length 64] [--generate 300] [--temperature 0.8] [--mirrored]
"""
import argparse
import gzip
import math
import sys

import numpy as np

import dtrain as tf

CORPORA = {
    "gcide": (["/usr/share/dictd/gcide.dict.dz"], "dict-gcide"),
    "fortunes": (["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/literature",
                  "/usr/share/games/fortunes/riddles"], "fortunes-min"),
}


def read_corpus(files, package, limit):
    """The files' bytes, one after the other (a .dz dictionary is gzip), at most `limit`."""
    parts, size = [], 0
    for path in files:
        try:
            opener = gzip.open if path.endswith(".dz") else open
            with opener(path, "rb") as f:
                parts.append(f.read(limit - size))
        except OSError as e:
            sys.exit(f"char_lm: cannot read {path} ({e}); install {package} (scripts/install-deps.sh --corpora) "
                     "or give --files")
        size += len(parts[-1])
        if size >= limit:
            break
    return np.frombuffer(b"".join(parts), np.uint8).astype(np.int32)


def windows(ids, length, batch, shuffle):
    """(input, target) batches: each window of length + 1 bytes split into the bytes and the
    bytes that follow them, as the tutorial's split_input_target does."""
    ds = tf.data.Dataset.from_tensor_slices(ids).batch(length + 1, drop_remainder=True)
    ds = ds.map(lambda chunk: (chunk[:-1], chunk[1:]))
    if shuffle:
        ds = ds.shuffle(10000, seed=0)
    return ds.batch(batch, drop_remainder=True)


def transformer(ids, length, width, heads, blocks, vocabulary, causal, mask_zero=False):
    """Ids embedded with learned positions, through `blocks` pre-norm blocks (attention,
    causal or not, then a GELU feed-forward), normalized: [batch, length, width]. With
    mask_zero, id 0 is padding, which attention and a later pooling leave out."""
    x = tf.keras.layers.Embedding(vocabulary, width, mask_zero=mask_zero)(ids)
    x = tf.keras.layers.Add()([x, tf.keras.layers.PositionEmbedding(length)(x)])
    for _ in range(blocks):
        h = tf.keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = tf.keras.layers.MultiHeadAttention(heads, width // heads)(h, h, use_causal_mask=causal)
        x = tf.keras.layers.Add()([x, h])
        h = tf.keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = tf.keras.layers.Dense(4 * width, activation="gelu")(h)
        x = tf.keras.layers.Add()([x, tf.keras.layers.Dense(width)(h)])
    return tf.keras.layers.LayerNormalization(epsilon=1e-5)(x)


def language_model(length, width=128, heads=4, blocks=2, vocabulary=256):
    ids = tf.keras.Input(shape=(length,), dtype="int32", name="bytes")
    x = transformer(ids, length, width, heads, blocks, vocabulary, causal=True)
    return tf.keras.Model(ids, tf.keras.layers.Dense(vocabulary)(x), name="char_lm")


def sample(model, ids, count, length, temperature, fill, seed=0):
    """`ids` and `count` more, each drawn from the model's distribution over the next id
    given the last `length` (`fill` before the first fills the window)."""
    rng = np.random.default_rng(seed)
    ids = list(ids)
    for _ in range(count):
        window = ([fill] * length + ids)[-length:]
        logits = model.predict(np.array([window], np.int32), verbose=0)[0, -1].astype(np.float64)
        p = np.exp((logits - logits.max()) / temperature)
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return ids


def generate(model, prompt, count, length, temperature, seed=0):
    """`count` bytes after `prompt` (spaces before it fill the first window)."""
    text = sample(model, prompt.encode(), count, length, temperature, fill=32, seed=seed)
    return bytes(text).decode("utf-8", errors="replace")


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--corpus", choices=sorted(CORPORA), default="gcide")
    a.add_argument("--files", nargs="+", help="text files to train on instead of a corpus")
    a.add_argument("--bytes", type=int, default=2_000_000, help="at most this much of the text")
    a.add_argument("--length", type=int, default=64)
    a.add_argument("--batch", type=int, default=32)
    a.add_argument("--epochs", type=int, default=3)
    a.add_argument("--generate", type=int, default=300)
    a.add_argument("--temperature", type=float, default=0.8)
    a.add_argument("--prompt", default="The ")
    a.add_argument("--mirrored", action="store_true", help="train under MirroredStrategy (one replica per core)")
    args = a.parse_args()
    files, package = (args.files, "the files") if args.files else CORPORA[args.corpus]
    ids = read_corpus(files, package, args.bytes)
    held_out = len(ids) // 10
    train, test = ids[:-held_out], ids[-held_out:]
    print(f"{len(ids)} bytes: {len(train)} to train on, {len(test)} held out")
    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.MirroredStrategy() if args.mirrored else tf.distribute.get_strategy()
    with strategy.scope():
        model = language_model(args.length)
        model.compile(optimizer=tf.keras.optimizers.Adam(3e-3),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    held = windows(test, args.length, args.batch, shuffle=False)
    model.fit(windows(train, args.length, args.batch, shuffle=True), epochs=args.epochs, validation_data=held, verbose=2)
    nats = model.evaluate(held, verbose=0, return_dict=True)["loss"]
    print(f"held-out loss {nats:.4f} nats per byte, {nats / math.log(2):.3f} bits per character")
    if args.generate > 0:
        print(generate(model, args.prompt, args.generate, args.length, args.temperature))


if __name__ == "__main__":
    main()
