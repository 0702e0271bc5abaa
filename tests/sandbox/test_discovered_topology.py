"""The sandbox's check that Volcano's discovered HyperNodes form a tree (sandbox/deploy.py
settle_discovered_topology). `make e2e` once failed because two tier-2 HyperNodes listed
the same tier-1 one, a race in Volcano v1.15.1's label discovery: the scheduler refused the
tree ("HyperNode hypernode-trainstack-tier1-2q7hk already has a parent
hypernode-trainstack-tier2-n95fb, and cannot set another parent
hypernode-trainstack-tier2-rnpdn") and skipped every job with a topology."""

from __future__ import annotations

from typing import Any

from trainstack.sandbox.deploy import duplicate_members


def _hypernode(name: str, kind: str, *members: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "members": [{"type": kind, "selector": {"exactMatch": {"name": m}}} for m in members]
        },
    }


def test_a_member_listed_by_two_hypernodes_is_found() -> None:
    found = [
        _hypernode("tier1-2q7hk", "Node", "h200-burst-0", "h200-burst-1"),
        _hypernode("tier2-n95fb", "HyperNode", "tier1-2q7hk"),
        _hypernode("tier2-rnpdn", "HyperNode", "tier1-2q7hk"),
    ]
    assert duplicate_members(found) == {"HyperNode/tier1-2q7hk": ["tier2-n95fb", "tier2-rnpdn"]}


def test_a_tree_has_none_and_regex_members_are_not_compared() -> None:
    found = [
        _hypernode("tier1-a", "Node", "n0", "n1"),
        _hypernode("tier1-b", "Node", "n2"),
        _hypernode("tier2-x", "HyperNode", "tier1-a", "tier1-b"),
        {
            "metadata": {"name": "pool"},
            "spec": {"members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "n.*"}}}]},
        },
    ]
    assert duplicate_members(found) == {}
