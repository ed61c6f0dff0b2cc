import dtrain as tf
import os

# Define the distributed strategy
strategy = tf.distribute.MultiWorkerMirroredStrategy()

# Define a larger model for simulation
def build_model_large():
  return tf.keras.models.Sequential([
    tf.keras.layers.Dense(1024, activation='relu', input_shape=(1024,)),
    tf.keras.layers.Dense(1024, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax')
  ])

# Prepare a larger batch size for a more realistic load
batch_size_per_replica = 64
global_batch_size = batch_size_per_replica * strategy.num_replicas_in_sync

# Create dummy data using tf.random
train_inputs = tf.random.normal((10000, 1024))
train_labels = tf.random.uniform((10000,), minval=0, maxval=10, dtype=tf.int32)

dataset = tf.data.Dataset.from_tensor_slices((train_inputs, train_labels))
dataset = dataset.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)

# Distributed training loop
with strategy.scope():
    model = build_model_large()
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

