"""The `prePull` section (training images on the GPU nodes ahead of use, docs/prepull.md):
cross-field checks on the raw document and the typed model.

The schema holds the defaults; what it cannot say is here: the pools an image names exist, an
image is listed once and pinned as the platform's own images are (config/images.py), and the
containerd settings, which trainstack writes into the nodes it launches, are for cloud: aws.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.config import k8s_syntax
from trainstack.config import model as m
from trainstack.config.checks import dict_items
from trainstack.config.errors import ConfigIssue, did_you_mean, join_path
from trainstack.config.images import is_pinned, pin_required

# Settings of the nodes' containerd, which trainstack owns only where it launches the nodes.
AWS_ONLY = ("soci", "maxConcurrentDownloads")


def prepull_checks(doc: Mapping[str, Any], root: str, pools: set[str] | None) -> list[ConfigIssue]:
    """What the schema cannot say about `prePull`; tolerant of wrongly shaped values.
    `pools`: the declared pool names (None when gpuPools itself is malformed)."""
    section = doc.get("prePull")
    if not isinstance(section, Mapping):
        return []
    path = join_path(root, "prePull")
    issues: list[ConfigIssue] = []
    if doc.get("cloud") == "existing":
        for key in AWS_ONLY:
            if key in section and section[key] != "off":
                issues.append(
                    ConfigIssue(
                        join_path(path, key),
                        "sets the nodes' containerd, which trainstack configures only on the "
                        "nodes it launches (cloud: aws); on an existing cluster its owners "
                        "configure containerd: remove it",
                    )
                )
    if section.get("soci") == "parallel-pull-unpack" and "maxConcurrentDownloads" in section:
        issues.append(
            ConfigIssue(
                join_path(path, "maxConcurrentDownloads"),
                "with soci: parallel-pull-unpack the SOCI snapshotter pulls, with its own "
                "concurrency (20 downloads per image on the EKS AMI), not containerd: remove "
                "maxConcurrentDownloads or turn soci off",
            )
        )
    production = doc.get("environment") == "production"
    seen: dict[str, int] = {}
    for index, item in dict_items(section.get("images")):
        at = join_path(path, "images", index)
        image = item.get("image")
        if isinstance(image, str):
            if image in seen:
                issues.append(
                    ConfigIssue(
                        join_path(at, "image"),
                        f"{image!r} is already listed at {join_path(path, 'images', seen[image])}; "
                        "list an image once, with every pool it is for",
                    )
                )
            seen.setdefault(image, index)
            if not k8s_syntax.image_reference(image) and not is_pinned(
                image, production=production
            ):
                issues.append(
                    ConfigIssue(
                        join_path(at, "image"),
                        f"{image!r} is not pinned by {pin_required(production)}: a moving tag "
                        "pulls other bytes on each node; pin it as the jobs that use it do",
                    )
                )
        named = item.get("pools")
        if pools is None or not isinstance(named, list):
            continue
        for j, pool in enumerate(named):
            if isinstance(pool, str) and pool not in pools:
                issues.append(
                    ConfigIssue(
                        join_path(at, "pools", j),
                        f"no GPU pool {pool!r}{did_you_mean(pool, pools)}; pools: "
                        f"{', '.join(sorted(pools)) or 'none'}",
                    )
                )
    return issues


def build_prepull(doc: Mapping[str, Any]) -> m.PrePull:
    """The typed section from the defaulted document."""
    section = doc["prePull"]
    return m.PrePull(
        enabled=section["enabled"],
        team_jobs=section["teamJobs"],
        images=tuple(
            m.PrePullImage(image=i["image"], pools=tuple(i.get("pools", ())))
            for i in section["images"]
        ),
        max_parallel_pulls=section["maxParallelPulls"],
        gate_minutes=section["gateMinutes"],
        holder_image=section["holderImage"],
        soci=section["soci"],
        max_concurrent_downloads=section.get("maxConcurrentDownloads"),
    )
