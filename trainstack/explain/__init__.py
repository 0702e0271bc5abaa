"""`trainstack explain` and `trainstack status` (issue 45): why a job is not running, in the
platform's terms, and a team's jobs at a glance. docs/explain.md describes each reason.

The diagnosis is pure (`diagnose`: live objects and the platform's outputs in, a `Diagnosis`
out); `read` fetches the objects and `cli` adds the commands (`register`).
"""

from trainstack.explain.diagnose import diagnose, refusal
from trainstack.explain.model import Diagnosis, Live, Platform, Pool, Reason

__all__ = ["Diagnosis", "Live", "Platform", "Pool", "Reason", "diagnose", "refusal"]
