"""trainstack: a multi-team GPU training platform as code, built on Pulumi."""

__version__ = "0.1.0"
