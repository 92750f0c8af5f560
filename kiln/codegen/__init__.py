"""Code generators: TIR PrimFuncs -> source -> loaded native module (``c/`` for CPUs)."""
