"""The custom training loop the strategy tests share: the seeds' step with
compute_average_loss, as TensorFlow's guide writes it for several replicas."""
import dtrain as tf


def train_custom_loop(strategy, model, optimizer, x, y, global_batch, steps=None):
    """Trains `model` (made under strategy.scope()) on (x, y) in global batches; returns
    each step's loss summed over the replicas."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(inputs, training=True)), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))
    losses = []
    for i, (inputs, labels) in enumerate(data):
        if i == steps:
            break
        losses.append(float(strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(inputs, labels)), axis=None)))
    return losses
