# Seed 002 (the one answering "why is my multi-GPU training slow"), example 1, with the
# import line changed. Completed where the seed elides: the dataset (Fashion-MNIST's first
# 10000 training images, labels one-hot for CategoricalCrossentropy) and the epochs, then
# what the model reached.
import dtrain as tf

# completed: the data and the epochs
from completions import fashion_mnist
x_train, y_train, x_test, y_test = fashion_mnist(flat=True)
epochs = 5

strategy = tf.distribute.MirroredStrategy()

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    optimizer = tf.keras.optimizers.Adam()
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)

    def train_step(inputs, labels):
        with tf.GradientTape() as tape:
            predictions = model(inputs)
            loss = loss_fn(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)  # completed: Your TensorFlow Dataset
    for epoch in range(epochs):
        for batch in dataset:
            strategy.run(train_step, args=(batch[0], batch[1]))

# completed: what the model reached (every replica trains on the whole batch here, as the
# seed's loop gives each the same batch, so each update sums their identical gradients)
accuracy = tf.keras.metrics.CategoricalAccuracy()
accuracy.update_state(y_test, model(x_test))
print("test accuracy", accuracy.result())
