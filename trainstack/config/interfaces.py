"""The network interfaces a job's pod has, and which of them NCCL's socket selector picks:
facts the config checks (config/pools.py) and the fabric profiles (builders/fabric.py) share.
"""

from __future__ import annotations

# Inside a pod: the cluster network is eth0 (containerd's CRI asks CNI for it,
# internal/cri/server/helpers.go defaultIfName), and Multus names the n-th secondary network
# net<n> unless the annotation names it (multus-cni v4.3.0 pkg/multus/multus.go getIfname).
POD_INTERFACE = "eth0"
SECONDARY_INTERFACE = "net1"


def pod_interfaces(secondary_network: str | None) -> tuple[str, ...]:
    """The network interfaces a job's pod has: no host NIC, since pods never use the host's
    network namespace (the `no-privileged` rule refuses hostNetwork)."""
    return (POD_INTERFACE, SECONDARY_INTERFACE) if secondary_network else (POD_INTERFACE,)


def socket_ifname_matches(value: str, interfaces: tuple[str, ...]) -> bool:
    """Whether NCCL_SOCKET_IFNAME=`value` selects at least one of `interfaces`.

    NCCL's syntax (v2.21.5 src/misc/socket.cc findInterfaces, src/misc/utils.cc matchIf): a
    leading `^` excludes, then a leading `=` makes the comma-separated entries exact names
    instead of prefixes. An exclusion list is taken to leave something.
    """
    if value.startswith("^"):
        return True
    exact = value.startswith("=")
    entries = [e.split(":")[0] for e in value.removeprefix("=").split(",") if e]
    return any(
        (name == entry) if exact else name.startswith(entry)
        for entry in entries
        for name in interfaces
    )
