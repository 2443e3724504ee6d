"""A plausible mistake, for tests: ``DECODER`` is a factory function instead of a Decoder subclass."""

from native_client.decoders.greedy import GreedyDecoder


def DECODER(spec):  # noqa: N802 - the name the lookup asks for
    """A greedy decoder (but the lookup wants the class)."""
    return GreedyDecoder(spec.alphabet())
