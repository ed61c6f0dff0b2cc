import dtrain as tf
import os
import time

# Define the distributed strategy
strategy = tf.distribute.MultiWorkerMirroredStrategy()

# Define model again
def build_model_small():
  return tf.keras.models.Sequential([
    tf.keras.layers.Dense(64, activation='relu', input_shape=(100,)),
    tf.keras.layers.Dense(10, activation='softmax')
  ])

# Create dummy data and simulating a slow data loading pipeline
def slow_data_generator(size=1000):
  for _ in range(size):
    time.sleep(0.01) # simulate processing
    yield (tf.random.normal((100,)), tf.random.uniform((), minval=0, maxval=10, dtype=tf.int32))

dataset = tf.data.Dataset.from_generator(slow_data_generator, output_signature=(
    tf.TensorSpec(shape=(100,), dtype=tf.float32),
    tf.TensorSpec(shape=(), dtype=tf.int32)))

dataset = dataset.batch(32).prefetch(tf.data.AUTOTUNE)

# Distributed training loop
with strategy.scope():
    model = build_model_small()
    optimizer = tf.keras.optimizers.Adam()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step(inputs, labels):
        with tf.GradientTape() as tape:
            logits = model(inputs)
            loss = loss_fn(labels, logits)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss


    for epoch in range(2):
        for inputs, labels in dataset:
            loss = strategy.run(train_step, args=(inputs, labels,))
            print(f"Loss : {loss.numpy()}")

