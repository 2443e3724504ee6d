"""Language models: the Python Kneser-Ney estimator, KenLM's tools, the LM text."""
