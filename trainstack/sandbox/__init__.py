"""A real Kubernetes control plane on 127.0.0.1, with Volcano and simulated GPU nodes.

One implementation, two users: the e2e suite (tests/e2e/conftest.py starts a control plane per
session and deploys the example stacks on it) and the local sandbox (`trainstack sandbox up`
starts the same processes, deploys a platform stack and its team stacks, and leaves them
running until `trainstack sandbox down`).

- `toolchain`: the upstream programs (etcd, kube-apiserver, Volcano, kwok, ...), built from
  pinned Go modules into a cache outside the repository.
- `cluster`: starts and stops those processes (`ControlPlane`).
- `nodes`, `deploy`: simulated nodes as a stack's pools would bring them, and a plan applied
  the way the Pulumi engine orders it; `stacks`: a platform stack and its team stacks deployed.
- `local`: the sandbox's state file and its `up` / `down` commands.

The Go wrapper modules live in `tools/`, next to this file: a checkout has them, a wheel does
not (the sandbox is for a clone of the repository; `toolchain` says so when they are absent).
"""
