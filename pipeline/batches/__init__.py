"""The model's input from the feature cache, shared by training and evaluation: tf.data batches read from
disk (``dataset.py``) and the feature-level augmentation drawn inside them (``augment.py``)."""
