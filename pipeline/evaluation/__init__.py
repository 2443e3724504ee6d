"""Running a model over a split, WER/CER scoring, logits kept on disk."""
