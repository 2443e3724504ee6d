"""The deployable inference runtime: load an export, stream or transcribe audio, decode.

Needs numpy, soundfile, scipy, python_speech_features and a TFLite interpreter
(``ai-edge-litert``, or TensorFlow); never luigi or the training code.

    from native_client import Model
    model = Model("export/")          # or a DeepSpeech 0.7+/Coqui STT model: Model("model.tflite")
    print(model.transcribe_file("clip.wav").text)
    stream = model.create_stream()
    stream.feed_audio(chunk); stream.intermediate_decode(); stream.finish()
"""

from native_client.metadata import ExportError, load_metadata
from native_client.model import Model, Transcript, open_model
from native_client.stream import Stream

__all__ = ["ExportError", "Model", "Stream", "Transcript", "load_metadata", "open_model"]
