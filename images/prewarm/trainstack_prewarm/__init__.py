"""Dataset pre-warm for trainstack: copy one dataset version onto the node's NVMe cache.

The init container runs ``trainstack-prewarm fetch``; the training container starts only after
it and gates on ``trainstack-prewarm verify``. See docs/prewarm.md for the contract.
"""

from trainstack_prewarm.errors import ExitCode, PrewarmError

__all__ = ["ExitCode", "PrewarmError"]
__version__ = "0.1.0"
