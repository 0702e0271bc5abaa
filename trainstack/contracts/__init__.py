"""What the platform and its images agree on, importable without the images' packages.

Each module here is a byte-identical copy of an image's contract module (tests/test_contracts.py):
`runtime` of images/runtime/trainstack_runtime/contract.py, `deadlines` of
images/deadlines/trainstack_deadlines/contract.py. The platform installs neither image package:
the runtime needs torch, and both ship alone in their images.
"""
