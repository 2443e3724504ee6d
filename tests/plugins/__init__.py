"""Implementations that live outside the project, as a user's would: found by dotted module name."""
