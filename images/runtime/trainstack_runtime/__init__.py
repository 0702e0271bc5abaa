"""trainstack in-container training runtime.

Import :mod:`trainstack_runtime.contract` for the constants the platform relies on; it does
not import torch. Everything else assumes torch is installed.
"""

__version__ = "0.1.0"

# Re-exported so `from trainstack_runtime import contract` is visible to type checkers too.
from trainstack_runtime import contract as contract
