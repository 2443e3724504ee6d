"""The alphabet; it lives in ``native_client`` so that training and inference read it the same way."""
from native_client.alphabet import Alphabet, AlphabetError, load_alphabet, parse_alphabet

__all__ = ["Alphabet", "AlphabetError", "load_alphabet", "parse_alphabet"]
