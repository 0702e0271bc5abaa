"""An organisation-scale trainstack project, generated: pools, teams, team stacks and jobs."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

GROUPS = 5


@dataclass(frozen=True)
class OrgSize:
    pools: int = 8
    teams: int = 50
    jobs: int = 500  # in total, spread evenly over the team stacks

    def times(self, factor: int) -> OrgSize:
        """The organisation grown `factor` times: teams and jobs; the GPU pools stay 8 types
        but grow in nodes, so every team's guarantee still fits."""
        return OrgSize(self.pools, self.teams * factor, self.jobs * factor)


def _pool(index: int, nodes: int) -> dict[str, Any]:
    zone = "us-east-1a" if index % 2 == 0 else "us-east-1b"
    if index % 2 == 0:
        return {
            "name": f"h100-r{index}",
            "instanceType": "p5.48xlarge",
            "fabric": "efa",
            "availabilityZone": zone,
            "capacity": {"type": "reservation", "reservationId": f"cr-{index:017x}"},
            "size": {"min": nodes, "desired": nodes, "max": nodes},
        }
    return {
        "name": f"h200-od{index}",
        "instanceType": "p5en.48xlarge",
        "fabric": "efa",
        "availabilityZone": zone,
        "size": {"min": 0, "max": nodes},
    }


def platform_config(size: OrgSize) -> dict[str, Any]:
    gpus_per_team = 8
    # Enough nodes per pool (8 GPUs each) for every guarantee and fair share, with headroom.
    nodes = max(1, -(-size.teams * gpus_per_team * 2 // (size.pools * 8)))
    pools = [_pool(i, nodes) for i in range(size.pools)]
    groups = [{"name": f"group-{g}", "owners": [f"lead-{g}@example.com"]} for g in range(GROUPS)]
    teams = [
        {
            "name": f"team-{t:04d}",
            "group": f"group-{t % GROUPS}",
            "owners": [f"team-{t:04d}@example.com"],
            "quota": {"gpus": gpus_per_team, "deserved": gpus_per_team, "borrowLimit": 8},
        }
        for t in range(size.teams)
    ]
    return {
        "cloud": "aws",
        "environment": "production",
        "clusterName": "trainstack-org",
        # Production pins the platform's own images by digest (config/loader.py).
        "scheduling": {"deadlines": {"image": f"registry.example.com/deadlines@sha256:{'0' * 64}"}},
        "kubernetesVersion": "1.33",
        "aws": {
            "region": "us-east-1",
            "network": {
                "vpcCidr": "10.0.0.0/16",
                "availabilityZones": ["us-east-1a", "us-east-1b"],
                "natGateways": "single",
            },
        },
        "storage": {
            "layoutImage": f"registry.example.com/prewarm@sha256:{'0' * 64}",
            "lustre": {
                "deploymentType": "PERSISTENT_2",
                "storageCapacityGiB": 28800,
                "perUnitStorageThroughput": 500,
                "availabilityZone": "us-east-1a",
                # The organisation spans two zones to size the plan; it accepts the
                # cross-zone reads rather than model a file system per zone.
                "allowCrossZone": True,
                "dataRepository": {"bucket": "acme-ml-datasets", "prefix": "datasets/"},
            },
            "checkpoints": {"bucket": "acme-trainstack-org-checkpoints", "retentionDays": 30},
        },
        "gpuPools": pools,
        "registry": {"groups": groups, "teams": teams},
    }


def job_spec(team: str, index: int, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainstack.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": f"job-{index:03d}", "team": team},
        "spec": {
            # By digest: the organisation is production, whose admission refuses tags.
            "image": f"registry.example.com/{team}/train@sha256:{'1' * 64}",
            "command": ["python", "-m", "train.main"],
            "args": [f"--seed={index}"],
            "pool": pool,
            "workers": {"replicas": 2, "gpus": 1, "cpu": "4", "memory": "16Gi"},
            "data": {"dataset": "imagenet", "version": "v20250401", "mountPath": "/mnt/data"},
            "checkpoint": {"intervalSeconds": 600, "keep": 3},
            "maxDurationHours": 24,
        },
    }


def _dump(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def generate(root: Path, size: OrgSize, *, program_dir: Path, with_jobs: bool) -> list[str]:
    """Write the project under `root`; return its stacks, platform first."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(program_dir / name, root / name)
    platform = platform_config(size)
    _dump(root / "stacks" / "Pulumi.org.yaml", {"config": {"trainstack:platform": platform}})
    stacks = ["org"]
    pools = [p["name"] for p in platform["gpuPools"]]
    per_team = size.jobs // size.teams if with_jobs else 0
    for t, team in enumerate(p["name"] for p in platform["registry"]["teams"]):
        section: dict[str, Any] = {"team": team, "platformStack": "acme/trainstack/org"}
        if per_team:
            section["jobs"] = [f"job_specs/{team}/*.yaml"]
            for j in range(per_team):
                pool = pools[(t + j) % len(pools)]
                _dump(root / "job_specs" / team / f"job-{j:03d}.yaml", job_spec(team, j, pool))
        _dump(root / "stacks" / f"Pulumi.{team}.yaml", {"config": {"trainstack:team": section}})
        stacks.append(team)
    return stacks
