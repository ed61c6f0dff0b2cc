"""Text as TensorFlow users have it: string tensors, tf.data.TextLineDataset, tf.strings,
TextVectorization (adapt, the output modes) and SentencePiece through keras_hub's names; a
classifier trained on raw sentences mapped to ids in the pipeline."""
import gzip

import numpy as np
import pytest

import dtrain as tf
import dtrain.keras_hub as keras_hub


def test_string_tensors_hold_bytes_and_refuse_arithmetic():
    t = tf.constant(["héllo", "b"])
    assert t.dtype == "string" and t.shape == (2,)
    assert t.numpy().tolist() == ["héllo".encode(), b"b"]
    assert tf.constant("one").numpy() == b"one"  # a scalar is its bytes, as in TensorFlow
    assert tf.constant([b"\x00raw"], dtype=tf.string).numpy()[0] == b"\x00raw"
    with pytest.raises(tf.errors.InvalidArgumentError, match="string"):
        tf.reduce_sum(t)
    with pytest.raises(TypeError, match="an array of object whose element 1 is a int"):
        tf.constant(np.array(["a", 1], dtype=object))
    assert tf.strings.lower(["ÄB"], encoding="utf-8").numpy()[0] == "äb".encode()
    assert tf.strings.regex_replace(["a, b!"], r"[,!]", "").numpy()[0] == b"a b"
    assert tf.strings.length(["héllo"], unit="UTF8_CHAR").numpy().tolist() == [5]
    assert tf.strings.join([["a", "b"], ["c", "d"]], separator="-").numpy().tolist() == [b"a-c", b"b-d"]


def test_text_lines_from_plain_and_gzip_files_through_a_pipeline(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"first line\r\n\nthird, with a comma\nno end")
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
        f.write(b"fourth\nfifth\n")
    lines = tf.data.TextLineDataset([str(tmp_path / "a.txt")])
    assert list(lines.as_numpy_iterator()) == [b"first line", b"", b"third, with a comma", b"no end"]
    gz = tf.data.TextLineDataset(str(tmp_path / "b.txt.gz"), compression_type="GZIP")
    assert list(gz.as_numpy_iterator()) == [b"fourth", b"fifth"]
    both = tf.data.TextLineDataset(tf.constant([str(tmp_path / "a.txt"), str(tmp_path / "b.txt.gz")]))
    batches = list(both.filter(lambda s: tf.strings.length(s) > 0).shuffle(8, seed=1).batch(3))
    assert sorted(b for batch in batches for b in batch.numpy()) == sorted(
        [b"first line", b"third, with a comma", b"no end", b"fourth", b"fifth"])
    with pytest.raises(OSError, match="missing.txt: cannot open"):
        list(tf.data.TextLineDataset(str(tmp_path / "missing.txt")))
    with pytest.raises(OSError, match="a.txt: compression_type is 'GZIP' but the file is not gzip"):
        list(tf.data.TextLineDataset(str(tmp_path / "a.txt"), compression_type="GZIP"))


def test_generators_and_slices_give_strings():
    ds = tf.data.Dataset.from_generator(lambda: iter([("a b", 0), ("c", 1)]),
                                        output_signature=(tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int32)))
    assert [(x, int(y)) for x, y in ds.as_numpy_iterator()] == [(b"a b", 0), (b"c", 1)]
    sliced = tf.data.Dataset.from_tensor_slices({"text": np.array(["x", "y"]), "n": np.arange(2)}).batch(2)
    element = next(iter(sliced))
    assert element["text"].numpy().tolist() == [b"x", b"y"]


def test_text_vectorization_learns_keras_vocabulary_and_pads():
    v = tf.keras.layers.TextVectorization(max_tokens=8, output_sequence_length=5)
    v.adapt(["The cat sat.", "the dog, the CAT!", "a bird"])
    # By count, ties by the token, descending; "" and "[UNK]" first; max_tokens counts them.
    assert v.get_vocabulary() == ["", "[UNK]", "the", "cat", "sat", "dog", "bird", "a"]
    assert v.vocabulary_size() == 8
    out = v(["the cat flew", "The dog sat on the mat today"])
    assert out.dtype == "int32"
    assert out.numpy().tolist() == [[2, 3, 1, 0, 0], [2, 5, 4, 1, 2]]
    assert v("the cat").numpy().tolist() == [2, 3, 0, 0, 0]
    longest = tf.keras.layers.TextVectorization()
    longest.adapt(np.array(["b a", "a"]))
    assert longest(["a", "a b a"]).numpy().tolist() == [[2, 0, 0], [2, 3, 2]]
    assert longest(np.array([["a"], ["b"]])).shape == (2, 1)  # [batch, 1] is a batch of strings


def test_text_vectorization_vector_modes_standardize_split_and_ngrams(tmp_path):
    hot = tf.keras.layers.TextVectorization(output_mode="multi_hot")
    hot.adapt(["a b b", "b c"])
    assert hot.get_vocabulary() == ["[UNK]", "b", "c", "a"]
    assert hot(["b b d"]).numpy().tolist() == [[1, 1, 0, 0]]
    count = tf.keras.layers.TextVectorization(output_mode="count", max_tokens=6, pad_to_max_tokens=True,
                                              vocabulary=["[UNK]", "b", "c", "a"])
    assert count(["b b d"]).numpy().tolist() == [[1, 2, 0, 0, 0, 0]]
    tfidf = tf.keras.layers.TextVectorization(output_mode="tf_idf")
    tfidf.adapt(["a b b", "b c"])
    idf_b, idf_c = np.log(1 + 2 / 3), np.log(1 + 2 / 2)
    np.testing.assert_allclose(tfidf(["b b d"]).numpy()[0], [np.mean([idf_b, idf_c, idf_c]), 2 * idf_b, 0, 0],
                               rtol=1e-6)
    chars = tf.keras.layers.TextVectorization(split="character", standardize="lower")
    chars.adapt(["Aab"])
    assert chars.get_vocabulary() == ["", "[UNK]", "a", "b"]
    grams = tf.keras.layers.TextVectorization(ngrams=2, standardize=None)
    grams.adapt(["x y z"])
    assert set(grams.get_vocabulary()[2:]) == {"x", "y", "z", "x y", "y z"}
    own = tf.keras.layers.TextVectorization(standardize=lambda s: tf.strings.regex_replace(s, "[0-9]", "#"))
    own.adapt(["a1 b22"])
    assert own.get_vocabulary()[2:] == ["b##", "a#"]
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("one\ntwo\n")
    from_file = tf.keras.layers.TextVectorization(vocabulary=str(vocab_file))
    assert from_file(["two one three"]).numpy().tolist() == [[3, 2, 1]]
    with pytest.raises(ValueError, match="holds 'one' twice"):
        tf.keras.layers.TextVectorization(vocabulary=["one", "one"])
    with pytest.raises(TypeError, match="cannot be a layer of a dtrain model"):
        tf.keras.Sequential([from_file])


def _sentiment(n, seed):
    rng = np.random.default_rng(seed)
    good, bad = ["great", "lovely", "fine", "superb"], ["awful", "dull", "poor", "bad"]
    filler = ["the", "film", "was", "quite", "a", "story", "and", "plot", "acting"]
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(2))
        words = list(rng.choice(filler, 6)) + [rng.choice(good if label else bad)]
        rng.shuffle(words)
        texts.append(" ".join(words).capitalize() + "!")
        labels.append(label)
    return np.array(texts), np.array(labels)


def test_a_classifier_trains_on_raw_text_vectorized_in_the_pipeline():
    texts, labels = _sentiment(800, 0)
    vectorize = tf.keras.layers.TextVectorization(max_tokens=40, output_sequence_length=8)
    vectorize.adapt(tf.data.Dataset.from_tensor_slices(texts).batch(64))
    ds = tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(800, seed=3).batch(32)
    ds = ds.map(lambda x, y: (vectorize(x), y)).cache()
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Embedding(40, 16),
                                 tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.02),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(ds, epochs=6, verbose=0)
    test_texts, test_labels = _sentiment(200, 1)
    _, accuracy = model.evaluate(vectorize(test_texts), test_labels, verbose=0)
    assert accuracy >= 0.95
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds strings"):
        model.fit(tf.data.Dataset.from_tensor_slices((texts, labels)).batch(32), verbose=0)


def test_sentence_piece_trained_by_the_pipeline_round_trips(tmp_path):
    texts, _ = _sentiment(400, 2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n")
    proto = keras_hub.tokenizers.compute_sentence_piece_proto(tf.data.TextLineDataset(str(corpus)), 60,
                                                              model_type="bpe")
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=proto, sequence_length=64)
    assert tokenizer.vocabulary_size() == 60
    assert tokenizer.get_vocabulary()[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = tokenizer(list(texts[:3]))
    assert ids.shape == (3, 64) and ids.dtype == "int32"
    assert tokenizer.detokenize(ids).numpy().tolist() == [t.encode() for t in texts[:3]]  # padding decodes to nothing
    one = keras_hub.tokenizers.SentencePieceTokenizer(proto, add_bos=True)(texts[0])
    assert one.numpy()[0] == 2 and len(one.numpy()) < len(texts[0])
    path = tmp_path / "sp.model"
    keras_hub.tokenizers.compute_sentence_piece_proto(list(texts), 60, proto_output_file=str(path))
    from_file = keras_hub.tokenizers.SentencePieceTokenizer(str(path))
    assert from_file.detokenize(from_file(texts[5])).numpy() == texts[5].encode()
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a model SentencePiece can load"):
        keras_hub.tokenizers.SentencePieceTokenizer(b"nonsense")
    with pytest.raises(tf.errors.InvalidArgumentError, match="id 60 at position 0 is outside the vocabulary"):
        from_file.detokenize([60])
