"""`trainstack-health repair`: drain the training pods of GPU nodes that failed their health
check, then ask for the node's repair, and ask for a re-check of nodes whose ranks keep
straggling (docs/health.md, "Repair").

One Deployment replica in the system namespace runs a pass every `--interval` seconds:

- `decide`: which nodes to act on and which pods to evict, the straggler query and who gets a
  re-check (pure functions, no I/O);
- `trainstack_health.kube` (shared with the agent): the Kubernetes API calls, over HTTPS
  with the standard library;
- `aws`: the EC2 Auto Scaling calls that replace an instance (mode "replace");
- `http`: the POST to the cluster owner's repair hook (mode "hook") and Prometheus's query API;
- `metrics`: the repair counters and the /metrics, /healthz server;
- `controller`: one pass, which reads, decides, acts and records;
- `cli`: the `repair` subcommand of `trainstack-health`.
"""
