"""TensorFlow's tutorial "Multi-worker training with Keras" (mnist_setup.py and main.py),
as it writes them, with `import tensorflow as tf` changed to `import dtrain as tf` and
Fashion-MNIST (Debian's) for MNIST; 20 steps per epoch so that it runs in the tests'
time. argv[1]: the backup folder. Run it on each worker with its TF_CONFIG
(`python3 -m dtrain launch --workers 2 -- python3 multi_worker_keras.py DIR`)."""
import json
import os
import sys

import numpy as np

import dtrain as tf


def mnist_dataset(batch_size):
    (x_train, y_train), _ = tf.keras.datasets.fashion_mnist.load_data()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=['accuracy'])
    return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=sys.argv[1])]


# Not the tutorial's: the test's stand-in for a preempted machine, worker 1 gone at the end
# of the epoch PREEMPT_WORKER_1_AFTER_EPOCH names (after the backup of that epoch).
class Preempted(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if str(epoch) == os.environ.get("PREEMPT_WORKER_1_AFTER_EPOCH") and tf_config['task']['index'] == 1:
            os._exit(3)


callbacks.append(Preempted())
history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=20, callbacks=callbacks, verbose=0)
print("task", tf_config['task']['index'], "epochs", len(history.history['loss']), "accuracy",
      history.history['accuracy'][-1])
