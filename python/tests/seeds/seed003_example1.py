# Seed 003, example 1, with the import line changed. Completed where the seed elides:
# the data (Fashion-MNIST's first 10000 training images, scaled to [0, 1], labels one-hot
# for categorical_crossentropy) and the layers (the smallest MLP that fits it).
import dtrain as tf

# completed: the data
from completions import fashion_mnist
x_train, y_train, x_test, y_test = fashion_mnist()

# Define your model
model = tf.keras.Sequential([
    # completed: your model layers
    tf.keras.layers.Flatten(input_shape=(28, 28)),
    tf.keras.layers.Dense(128, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax'),
])
# Compile the model
model.compile(optimizer='adam', loss='categorical_crossentropy', metrics=['accuracy'])
# Train the model
model.fit(x_train, y_train, epochs=10, batch_size=32)

# completed: what the model reached
print("test accuracy", model.evaluate(x_test, y_test, verbose=0)[1])
