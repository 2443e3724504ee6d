"""Implementations that live outside the project, as a user's would: found by dotted module name
(``features.type: tests.plugins.band_energies``, ``decoder.type: tests.plugins.echo_decoder``)."""
