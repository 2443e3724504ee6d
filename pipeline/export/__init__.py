"""Writing exports: the inference graph, SavedModel, frozen graph, TFLite."""
