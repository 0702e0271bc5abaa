"""trainstack's GPU node health gate (docs/health.md).

`agent`: a DaemonSet pod on each GPU node checks its own node (GPUs, ECC/XID, DCGM, fabric, an
intra-node NCCL all-reduce) and removes the startup taint when the node passes. `repair`: a
controller drains the training pods of failed nodes and asks for their replacement.
"""

__version__ = "0.1.0"
