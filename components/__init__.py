"""Thin Pulumi ComponentResources, one per capability.

Each validates, creates children named f"{name}-{role}" with parent=self, then calls
register_outputs last. Manifests and AWS inputs come from trainstack.builders.
"""
