"""mltrain's pip launcher: the `mltrain` command and `python -m mltrain` run the C++ binary in bin/.

The binary links the torch 2.15 wheel's LibTorch from this environment; nothing here imports torch.
"""

from ._launch import binary, main

__all__ = ["binary", "main"]
