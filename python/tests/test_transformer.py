"""The transformer's layers from Python, as Keras programs write them: Embedding,
PositionEmbedding, MultiHeadAttention called with Keras's keywords, LayerNormalization,
GlobalAveragePooling1D; attention against numpy from the layer's own weights; a functional
classifier that learns token order, its JSON round trip, and eager calls in a model of
your own."""
import numpy as np
import pytest

import dtrain as tf


def _attention_in_numpy(layer, query, value, causal, mask=None, weights=False):
    qk, qb, kk, kb, vk, vb, ok, ob = [w.numpy() for w in layer.weights]
    q = np.einsum("btf,fhd->bthd", query, qk) + qb
    k = np.einsum("bsf,fhd->bshd", value, kk) + kb
    v = np.einsum("bsf,fhd->bshd", value, vk) + vb
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    seen = np.ones(scores.shape[-2:], bool)
    if causal:
        seen = np.tril(seen)
    seen = seen[None, None] if mask is None else (seen[None] & mask.astype(bool))[:, None]
    scores = np.where(seen, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if weights:
        return p
    heads = np.einsum("bhts,bshd->bthd", p, v)
    return np.einsum("bthd,hdo->bto", heads, ok) + ob


def test_multi_head_attention_is_keras_attention_from_its_weights():
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, 5, 6)).astype(np.float32)
    value = rng.normal(size=(2, 7, 4)).astype(np.float32)
    mha = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, bias_initializer="random_normal")
    out = mha(query, value).numpy()
    assert out.shape == (2, 5, 6)
    assert [w.shape for w in mha.weights][:2] == [(6, 2, 3), (2, 3)]
    np.testing.assert_allclose(out, _attention_in_numpy(mha, query, value, False), rtol=1e-4, atol=1e-5)
    mask = rng.random((2, 5, 7)) < 0.7
    mask[:, :, 0] = True
    np.testing.assert_allclose(mha(query, value, attention_mask=mask).numpy(),
                               _attention_in_numpy(mha, query, value, False, mask), rtol=1e-4, atol=1e-5)
    square = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
    np.testing.assert_allclose(square(query, query, use_causal_mask=True).numpy(),
                               _attention_in_numpy(square, query, query, True), rtol=1e-4, atol=1e-5)
    out, scores = square(query, query, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(out.numpy(), _attention_in_numpy(square, query, query, True), rtol=1e-4, atol=1e-5)
    assert scores.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(scores.numpy(), _attention_in_numpy(square, query, query, True, weights=True),
                               rtol=1e-4, atol=1e-6)
    ids = tf.keras.Input(shape=(5, 6))
    with pytest.raises(NotImplementedError, match="return_attention_scores"):
        square(ids, ids, return_attention_scores=True)


def _classifier(length=12, vocabulary=16):
    tf.keras.utils.set_random_seed(5)
    ids = tf.keras.Input(shape=(length,), dtype="int32", name="ids")
    x = tf.keras.layers.Embedding(vocabulary, 16)(ids)
    x = tf.keras.layers.Add()([x, tf.keras.layers.PositionEmbedding(length)(x)])
    h = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x)
    h = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, dropout=0.1)(h, h, use_causal_mask=True)
    x = tf.keras.layers.Add()([x, h])
    h = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x)
    h = tf.keras.layers.Dense(32, activation="gelu")(h)
    x = tf.keras.layers.Add()([x, tf.keras.layers.Dense(16)(h)])
    outputs = tf.keras.layers.Dense(2)(tf.keras.layers.GlobalAveragePooling1D()(x))
    return tf.keras.Model(ids, outputs)


def _ordered_pairs(rows, length=12, vocabulary=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocabulary, size=(rows, length))
    labels = np.zeros(rows, np.int32)
    for r in range(rows):
        a, b = rng.choice(length, 2, replace=False)
        ids[r, a], ids[r, b] = 1, 2
        labels[r] = int(a < b)
    return ids.astype(np.int32), labels


def test_a_keras_transformer_classifier_learns_token_order_and_round_trips_its_json():
    x, y = _ordered_pairs(512)
    x_test, y_test = _ordered_pairs(256, seed=1)
    model = _classifier()
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=12, verbose=0)
    assert model.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"] > 0.9
    text = model.to_json()
    assert '"use_causal_mask": true' in text and '"MultiHeadAttention"' in text
    again = tf.keras.models.model_from_json(text)
    again.set_weights(model.get_weights())
    np.testing.assert_allclose(again.predict(x_test[:8]), model.predict(x_test[:8]), rtol=1e-5, atol=1e-6)


def _masked_encoder(length, mask_zero, attention_mask=False):
    tf.keras.utils.set_random_seed(3)
    ids = tf.keras.Input(shape=(length,), dtype="int32", name="ids")
    x = tf.keras.layers.Embedding(10, 8, mask_zero=mask_zero)(ids)
    inputs = [ids]
    if attention_mask:
        allowed = tf.keras.Input(shape=(length, length), name="allowed")
        inputs.append(allowed)
        h = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(x, x, attention_mask=allowed)
    else:
        h = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(x, x)
    x = tf.keras.layers.Add()([x, h])
    x = tf.keras.layers.GlobalAveragePooling1D()(tf.keras.layers.LayerNormalization()(x))
    return tf.keras.Model(inputs if attention_mask else ids, tf.keras.layers.Dense(3)(x))


def test_padding_masked_by_mask_zero_changes_nothing_and_an_attention_mask_is_an_input():
    rng = np.random.default_rng(2)
    ids = rng.integers(1, 10, size=(4, 5)).astype(np.int32)
    padded = np.zeros((4, 8), np.int32)
    padded[:, :5] = ids
    masked, plain = _masked_encoder(8, True), _masked_encoder(5, False)
    plain.set_weights(masked.get_weights())
    np.testing.assert_allclose(masked.predict(padded, verbose=0), plain.predict(ids, verbose=0), rtol=1e-5, atol=1e-6)
    again = tf.keras.models.model_from_json(masked.to_json())
    again.set_weights(masked.get_weights())
    np.testing.assert_allclose(again.predict(padded, verbose=0), plain.predict(ids, verbose=0), rtol=1e-5, atol=1e-6)
    # An attention mask given as a model input: the first three keys only, for every query.
    with_mask = _masked_encoder(5, False, attention_mask=True)
    with_mask.set_weights(plain.get_weights())
    allowed = np.zeros((4, 5, 5), np.float32)
    allowed[:, :, :3] = 1
    everything = np.ones((4, 5, 5), np.float32)
    np.testing.assert_allclose(with_mask.predict([ids, everything], verbose=0), plain.predict(ids, verbose=0),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(with_mask.predict([ids, allowed], verbose=0), plain.predict(ids, verbose=0), atol=1e-4)
    assert '"attention_mask"' in with_mask.to_json()


def test_an_id_outside_the_table_is_named():
    layer = tf.keras.layers.Embedding(10, 4, name="tokens")
    with pytest.raises(ValueError, match="'tokens'.*id 12 at position 2"):
        layer(np.array([[1, 2, 12]], np.int32))


def _example(name, monkeypatch):
    """examples/NAME.py as a module (the examples import each other)."""
    import importlib
    import os

    monkeypatch.syspath_prepend(os.path.join(os.environ.get("DTRAIN_SOURCE_DIR", "."), "examples"))
    return importlib.import_module(name)


def test_a_causal_language_model_learns_a_sequence_from_windows_of_text(monkeypatch):
    char_lm = _example("char_lm", monkeypatch)
    text = np.frombuffer(b"the cat sat on the mat. " * 120, np.uint8).astype(np.int32)
    tf.keras.utils.set_random_seed(0)
    model = char_lm.language_model(16, width=32, heads=2, blocks=1)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    # TensorFlow's text-generation idiom: windows of length + 1 split into inputs and targets.
    data = char_lm.windows(text, 16, 8, shuffle=True)
    first = next(iter(data))
    assert first[0].shape == (8, 16) and first[1].shape == (8, 16)
    np.testing.assert_array_equal(first[0].numpy()[:, 1:], first[1].numpy()[:, :-1])
    history = model.fit(data, epochs=6, verbose=0)
    # Every byte after the first few of a window follows from the ones before it.
    assert history.history["accuracy"][-1] > 0.85
    assert char_lm.generate(model, "the cat ", 16, 16, temperature=0.1).startswith("the cat sat on the")


def test_the_encoder_classifier_example_reads_dictionary_entries_and_trains(monkeypatch):
    pos = _example("pos_classifier", monkeypatch)
    text = ('Abjure \\Ab*jure"\\, v. t. [imp. & p. p. {Abjured}; p. pr. & vb.\n   n. {Abjuring}.]\n'
            '   1. To renounce upon oath; to forswear.\n   [1913 Webster]\n\n'
            'Abjurer \\Ab*jur"er\\, n.\n   One who abjures.\n   [1913 Webster]\n\n'
            '00-database-info\n   not an entry\n\n'
            'Abjectly \\Ab"ject*ly\\, adv.\n   In an abject manner; meanly.\n   [1913 Webster]\n')
    pairs = pos.entries(text)
    assert pairs == [("1. To renounce upon oath; to forswear.", 2), ("One who abjures.", 0),
                     ("In an abject manner; meanly.", 3)]
    x, y = pos.encode(pairs * 8, 24)
    assert x.shape == (24, 24) and bytes(x[1, :16].astype(np.uint8)) == b"One who abjures."
    tf.keras.utils.set_random_seed(0)
    model = pos.encoder_classifier(24, width=16, heads=2, blocks=1)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    assert model.fit(x, y, batch_size=8, epochs=15, verbose=0).history["accuracy"][-1] == 1.0


def test_gelu_exact_and_tanh_as_tensorflow_gives_them():
    import math

    x = np.linspace(-4, 4, 33).astype(np.float32)
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    tanh_form = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x]
    np.testing.assert_allclose(tf.nn.gelu(x).numpy(), exact, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tf.nn.gelu(x, approximate=True).numpy(), tanh_form, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tf.keras.activations.gelu(x, approximate=True).numpy(), tanh_form, rtol=1e-4, atol=1e-5)
    v = tf.Variable(x)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tf.nn.gelu(v, approximate=True))
    grad = tape.gradient(y, v).numpy()
    t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
    want = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5)
