"""One rule set, three enforcement points: CrossGuard, the offline preview, and CEL."""
