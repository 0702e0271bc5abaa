"""Semantic plan diff: what a change to the platform means for teams, capacity and jobs."""
