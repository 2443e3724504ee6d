"""Features: the front ends' training-side glue, the HDF5 feature cache, audio-level augmentation."""
