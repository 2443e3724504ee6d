"""Luigi tasks of the pipeline; ``luigi --module tasks <Task> --config <yaml>`` finds each of them."""
from tasks.features import Features, FeaturesSplit

__all__ = ["Features", "FeaturesSplit"]
