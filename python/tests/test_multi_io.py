"""Models of several inputs and outputs, as Keras's functional API guide writes them: fit and
evaluate on dicts and lists of arrays and on datasets of nested elements, a loss and a
weight for each output, metrics per output, and the same training whichever way the data
comes."""
import numpy as np
import pytest

import dtrain as tf


def _ticket_model(seed=3):
    """Two inputs (title, body), two outputs (priority: a number; department: 3 classes)."""
    tf.keras.utils.set_random_seed(seed)
    title = tf.keras.Input(shape=(6,), name="title")
    body = tf.keras.Input(shape=(4,), name="body")
    x = tf.keras.layers.Concatenate()([title, body])
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    priority = tf.keras.layers.Dense(1, name="priority")(x)
    department = tf.keras.layers.Dense(3, name="department")(x)
    model = tf.keras.Model(inputs=[title, body], outputs=[priority, department])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss={"priority": "mean_squared_error",
                        "department": tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  loss_weights={"priority": 1.0, "department": 0.2},
                  metrics={"department": ["accuracy"]})
    return model


def _tickets(n=96):
    rng = np.random.default_rng(0)
    title = rng.normal(size=(n, 6)).astype(np.float32)
    body = rng.normal(size=(n, 4)).astype(np.float32)
    priority = (title[:, :1] - body[:, 1:2]).astype(np.float32)
    department = np.argmax(title[:, :3] + body[:, :3], axis=1)
    return title, body, priority, department


def test_dicts_lists_and_datasets_of_nested_elements_train_alike():
    title, body, priority, department = _tickets()
    runs = {}
    by_dict = _ticket_model()
    runs["dicts"] = by_dict.fit({"body": body, "title": title}, {"department": department, "priority": priority},
                                batch_size=16, epochs=2, shuffle=False, verbose=0)
    weights = by_dict.get_weights()
    by_list = _ticket_model()
    runs["lists"] = by_list.fit([title, body], [priority, department], batch_size=16, epochs=2, shuffle=False,
                                verbose=0)
    # A dict flattens in the order of its sorted keys (body before title, department before
    # priority): fit puts each component where the model takes it.
    for name, elements in (("dict dataset", ({"title": title, "body": body}, {"priority": priority, "department": department})),
                           ("tuple dataset", ((title, body), (priority, department)))):
        model = _ticket_model()
        dataset = tf.data.Dataset.from_tensor_slices(elements).batch(16)
        runs[name] = model.fit(dataset.map(lambda features, labels: (features, labels)), epochs=2, verbose=0)
        for a, b in zip(model.get_weights(), weights):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)
    for a, b in zip(by_list.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    logs = runs["dicts"].history
    assert set(logs) == {"loss", "priority_loss", "department_loss", "department_accuracy"}
    for name, history in runs.items():
        np.testing.assert_allclose(history.history["loss"], logs["loss"], rtol=1e-5, err_msg=name)


def test_the_loss_is_the_weighted_sum_and_evaluate_lists_as_keras_does():
    title, body, priority, department = _tickets()
    model = _ticket_model()
    model.fit([title, body], [priority, department], batch_size=32, epochs=3, verbose=0)
    logs = model.evaluate({"title": title, "body": body}, {"priority": priority, "department": department},
                          batch_size=40, verbose=0, return_dict=True)
    assert list(logs) == ["loss", "priority_loss", "department_loss", "department_accuracy"]
    assert logs["loss"] == pytest.approx(logs["priority_loss"] + 0.2 * logs["department_loss"], rel=1e-5)
    # Each output's own loss, from its predictions.
    p, d = model.predict([title, body], batch_size=50)
    assert p.shape == (96, 1) and d.shape == (96, 3)
    assert logs["priority_loss"] == pytest.approx(float(np.mean((p - priority) ** 2)), rel=1e-5)
    assert logs["department_accuracy"] == pytest.approx(float(np.mean(np.argmax(d, axis=1) == department)))
    values = model.evaluate([title, body], [priority, department], verbose=0)
    assert values == pytest.approx(list(logs.values()))
    called = model({"title": title[:3], "body": body[:3]})
    # Three rows against predict's batches of 50: the matmul may block the rows otherwise
    # and round a sum differently, a few ulps.
    np.testing.assert_allclose(called[1].numpy(), d[:3], rtol=1e-5, atol=1e-6)


def test_two_replicas_train_several_inputs_and_outputs_as_one_device():
    title, body, priority, department = _tickets(90)
    one = _ticket_model()
    one.fit([title, body], [priority, department], batch_size=30, epochs=2, shuffle=False, verbose=0)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        two = _ticket_model()
    dataset = tf.data.Dataset.from_tensor_slices(({"title": title, "body": body},
                                                  {"priority": priority, "department": department})).batch(30)
    two.fit(dataset, epochs=2, verbose=0)
    for a, b in zip(two.get_weights(), one.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_mistakes_with_several_inputs_and_outputs_are_named():
    title, body, priority, department = _tickets(8)
    model = _ticket_model()
    with pytest.raises(ValueError, match="the dict has no input 'body'"):
        model.fit({"title": title}, [priority, department], verbose=0)
    with pytest.raises(ValueError, match="takes 2 inputs \\(title, body\\); give a list"):
        model.fit(title, [priority, department], verbose=0)
    with pytest.raises(ValueError, match="has 2 output\\(s\\) \\(priority, department\\), got a list of 3"):
        model.fit([title, body], [priority, department, department], verbose=0)
    with pytest.raises(ValueError, match="the dict's key 'urgency' names no output"):
        model.fit([title, body], {"priority": priority, "department": department, "urgency": priority}, verbose=0)
    with pytest.raises(ValueError, match="'urgency' names no output of the model \\(priority, department\\)"):
        model.compile(loss={"urgency": "mean_squared_error"})
    with pytest.raises(ValueError, match="output 'department' has no loss"):
        model.compile(loss={"priority": "mean_squared_error"})
    pairs = tf.data.Dataset.from_tensor_slices((title, priority)).batch(4)
    with pytest.raises(ValueError, match="hold 1 input component\\(s\\) \\(one tensor\\)"):
        model.fit(pairs, verbose=0)
    with pytest.warns(UserWarning, match="'notes'.*ignored"):
        model.predict({"title": title, "body": body, "notes": body})


def test_nested_elements_keep_their_structure_through_the_pipeline():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.arange(6)
    ds = tf.data.Dataset.from_tensor_slices(({"b": x, "a": x * 10}, (y, y * 2)))
    first = next(iter(ds))
    assert set(first[0]) == {"a", "b"} and isinstance(first[1], tuple)
    assert float(first[0]["a"].numpy()[1]) == 10.0
    doubled = ds.map(lambda features, labels: ({"sum": features["a"] + features["b"]}, labels[1]))
    batches = list(doubled.batch(4).as_numpy_iterator())
    np.testing.assert_array_equal(batches[0][0]["sum"], (x * 11)[:4])
    np.testing.assert_array_equal(batches[1][1], [8, 10])
    kept = ds.filter(lambda features, labels: int(labels[0].numpy()) % 2 == 0)
    assert [int(e[1][0].numpy()) for e in kept] == [0, 2, 4]

    def rows():
        for i in range(3):
            yield {"ids": np.full((2,), i, np.int32)}, np.float32(i)

    gen = tf.data.Dataset.from_generator(rows, output_signature=({"ids": tf.TensorSpec((2,), tf.int32)},
                                                                 tf.TensorSpec((), tf.float32)))
    element = list(gen.batch(3))[0]
    assert element[0]["ids"].shape == (3, 2) and element[1].shape == (3,)
