"""Luigi tasks of the pipeline; ``luigi --module tasks <Task> --config <yaml>`` finds each of them."""
from tasks.export import Export, Transcribe
from tasks.features import Features, FeaturesSplit
from tasks.training import Evaluate, Train

__all__ = ["Features", "FeaturesSplit", "Train", "Evaluate", "Export", "Transcribe"]
