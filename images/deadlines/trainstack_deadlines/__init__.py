"""The platform's enforcer of trainstack jobs' maximum duration.

A small controller: every interval it lists the Volcano Jobs of the team namespaces, works out
which have run past their deadline (`trainstack_deadlines.decide`, pure) and stops them the way
Volcano stops a job, with a `bus.volcano.sh/v1alpha1` Command (`TerminateJob`). See
docs/deadlines.md for the contract.
"""

__version__ = "0.1.0"
