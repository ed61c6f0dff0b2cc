# Seed 003, example 2, with the import line changed. Completed as example 1 (data, layers).
import dtrain as tf

# completed: the data
from completions import fashion_mnist
x_train, y_train, x_test, y_test = fashion_mnist()

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    # Define your model within the scope
    model = tf.keras.Sequential([
        # completed: your model layers
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10, activation='softmax'),
    ])
    # Compile the model
    model.compile(optimizer='adam', loss='categorical_crossentropy', metrics=['accuracy'])
    # Train the model using the distributed strategy
    model.fit(x_train, y_train, epochs=10, batch_size=32 * strategy.num_replicas_in_sync)

# completed: what the model reached
print("test accuracy", model.evaluate(x_test, y_test, verbose=0)[1])
