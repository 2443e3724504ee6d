"""Corpus data: DeepSpeech CSV manifests, corpus importers (one module each), text normalisation."""
