"""The control plane itself: the versions it claims, loopback only, its pieces all working."""

from __future__ import annotations

from pathlib import Path

from trainstack.kube import Kube, wait_for
from trainstack.sandbox import toolchain
from trainstack.sandbox.cluster import ControlPlane


def test_versions_are_the_pinned_ones(kube: Kube) -> None:
    """The ldflags took: /version reports the pinned release, not v0.0.0-master."""
    version = kube.request("GET", "/version")
    assert version["gitVersion"] == toolchain.BY_NAME["kubernetes"].version
    assert (version["major"], version["minor"]) == ("1", "37")


def _listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the given processes own."""
    inodes: dict[str, int] = {}
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = fd.readlink().as_posix()
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                found.append((inodes[inode], _address(local)))
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    if len(host) == 8:
        octets = [str(int(host[i : i + 2], 16)) for i in range(6, -1, -2)]
        return f"{'.'.join(octets)}:{int(port, 16)}"
    return f"[{host}]:{int(port, 16)}"


def test_every_process_listens_on_loopback_only(control_plane: ControlPlane) -> None:
    pids = {p.popen.pid for p in control_plane.processes.values() if p.popen is not None}
    listening = _listening(pids)
    assert listening, "no listening sockets found: the check itself is broken"
    names = {p.popen.pid: n for n, p in control_plane.processes.items() if p.popen is not None}
    outside = [(names[pid], a) for pid, a in listening if not a.startswith("127.")]
    assert not outside, f"listening beyond loopback: {outside}"


def test_namespaces_get_service_accounts_and_finalise(kube: Kube) -> None:
    """kube-controller-manager runs: a new namespace gets its default ServiceAccount and a
    deleted one goes away (namespace finaliser), which scenario resets rely on."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "e2e-smoke"}})
    wait_for(
        "default ServiceAccount in e2e-smoke",
        lambda: kube.get_or_none("v1", "ServiceAccount", "default", "e2e-smoke"),
    )
    kube.delete("v1", "Namespace", "e2e-smoke")
    wait_for("e2e-smoke deleted", lambda: kube.get_or_none("v1", "Namespace", "e2e-smoke") is None)
