"""The hub <-> agent protocol: ``.proto`` source and generated stubs."""
