"""One module per command: each parses its options and calls the library; rendering lives in ``render.py``."""
