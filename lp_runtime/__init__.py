"""lp_runtime: lookahead decoding with lookahead parallelism for HuggingFace transformers models.

``from lp_runtime import LookaheadGenerator`` is the Python API (lp_runtime.api); the heavy imports (torch,
transformers) happen on first use, so ``python -m lp_runtime.generate`` can refuse bad input quickly. Importing
the package sets MKL's mode on a non-Intel CPU (``lp_runtime.blas``).
"""
from .blas import choose_mkl_mode

__version__ = "0.1.0"
choose_mkl_mode()  # before torch's first matrix product (lp_runtime.blas)
__all__ = ["LookaheadGenerator", "Decoder", "GenerationOutput"]


def __getattr__(name):
    if name == "LookaheadGenerator":
        from .api import LookaheadGenerator

        return LookaheadGenerator
    if name in ("Decoder", "GenerationOutput"):
        from . import decoder

        return getattr(decoder, name)
    raise AttributeError(f"module 'lp_runtime' has no attribute {name!r}")
