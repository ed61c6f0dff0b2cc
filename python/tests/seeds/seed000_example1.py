import dtrain as tf
import os

# Define the distributed strategy
strategy = tf.distribute.MultiWorkerMirroredStrategy()

# Define a basic model for simplicity
def build_model():
    return tf.keras.models.Sequential([
      tf.keras.layers.Dense(64, activation='relu', input_shape=(100,)),
      tf.keras.layers.Dense(10, activation='softmax')
    ])

# Prepare a mock dataset
dataset = tf.data.Dataset.from_tensor_slices((tf.random.normal((1000, 100)),
                                              tf.random.uniform((1000,), minval=0, maxval=10, dtype=tf.int32)))
dataset = dataset.batch(32).prefetch(tf.data.AUTOTUNE)

# Distributed training loop
with strategy.scope():
    model = build_model()
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

