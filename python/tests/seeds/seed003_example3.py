# Seed 003, example 3, with the import line changed. Completed where the seed elides: the
# data and layers as example 1, and, since its dataset repeats forever, the steps an epoch
# (take), then what the model reached.
import dtrain as tf

# completed: the data
from completions import fashion_mnist
x_train, y_train, x_test, y_test = fashion_mnist()

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([
        # completed: your model layers
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10, activation='softmax'),
    ])
    optimizer = tf.keras.optimizers.Adam()
def train_step(inputs, labels):
    with tf.GradientTape() as tape:
        predictions = model(inputs)
        loss = tf.keras.losses.categorical_crossentropy(labels, predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32).repeat()
dataset = dataset.take(len(x_train) // 32)  # completed: one pass an epoch
distributed_dataset = strategy.experimental_distribute_dataset(dataset)
for epoch in range(10):
    for batch in distributed_dataset:
        strategy.run(train_step, args=(batch[0], batch[1]))

# completed: what the model reached
accuracy = tf.keras.metrics.CategoricalAccuracy()
accuracy.update_state(y_test, model(x_test))
print("test accuracy", accuracy.result())
