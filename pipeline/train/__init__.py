"""Training: the compiled step, the loop, the policy, tf.data input, devices and workers."""
