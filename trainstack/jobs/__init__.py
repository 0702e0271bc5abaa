"""The job layer: strict job specs rendered into Volcano Jobs."""
