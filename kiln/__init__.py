"""kiln: a deep-learning compiler (graph IR -> tensor expressions -> TIR -> native code)."""

__version__ = "0.1.0"
