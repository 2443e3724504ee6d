"""The training pipeline library: no Luigi here (tasks/ wraps it), no work at import time."""
