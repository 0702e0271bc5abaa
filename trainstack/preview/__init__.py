"""Offline preview: the real program under Pulumi's mock engine, written out as a plan."""
