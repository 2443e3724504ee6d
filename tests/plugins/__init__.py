"""Implementations that tests register by dotted path (``decoder.type: tests.plugins.echo_decoder``), as a
user's own module would be: nothing in the project names them."""
