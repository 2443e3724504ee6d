"""``deepspeech-serve``: a WebSocket server in vosk-server's protocol and ``POST /stt``, stepping many
streams in one model call (``engine``); see ``cli`` and docs/CLIENT.md "Serving"."""
