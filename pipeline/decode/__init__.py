"""Decoding with the language model: settings (tuned or configured) and the multi-process pool."""
