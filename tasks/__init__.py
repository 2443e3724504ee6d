"""Luigi tasks of the pipeline; ``luigi --module tasks <Task> --config <yaml>`` finds each of them."""

from tasks.alphabet import Alphabet
from tasks.evaluate import Evaluate
from tasks.export import Export, Transcribe
from tasks.features import Features, FeaturesSplit
from tasks.importing import Import, Imports
from tasks.language_model import LanguageModel, TuneDecoder
from tasks.phonemes import Phonemes
from tasks.training import Train

__all__ = [
    "Import",
    "Imports",
    "Phonemes",
    "Alphabet",
    "Features",
    "FeaturesSplit",
    "Train",
    "Evaluate",
    "Export",
    "Transcribe",
    "LanguageModel",
    "TuneDecoder",
]
