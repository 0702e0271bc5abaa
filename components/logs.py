"""The node log collector: the upstream chart, pinned, and the right to write job logs.

One OpenTelemetry Collector per node ships every training job's container logs to the
platform's bucket under `logs/teams/<team>/<job>/` (builders/logs.py has the pipeline and why,
docs/logs.md the story). On AWS its IAM role (IRSA) may only put objects under `logs/teams/`;
each team's role may only read its own prefix (builders/storage.team_s3_policy), and the bucket
expires them after the team's log retention (checkpoint_lifecycle_rules). On an existing
cluster it writes to `storage.objectStore` with the keys of a Secret the store's owners keep in
`trainstack-system` (`objectStore.collectorSecret`), which their policies confine likewise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pulumi
import pulumi_aws as aws

from trainstack.builders import logs as b
from trainstack.builders.storage import irsa_trust_policy
from trainstack.components.kube import addon_release
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig


@dataclass(frozen=True)
class AwsLogAccess:
    """What the collector's IAM role needs on AWS."""

    key_arn: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_issuer_url: pulumi.Input[str]
    provider: pulumi.ProviderResource


@dataclass(frozen=True)
class LogCollectorArgs:
    config: PlatformConfig
    bucket: str
    region: str
    k8s_provider: pulumi.ProviderResource
    aws: AwsLogAccess | None = None  # None: an existing cluster's object store
    depends_on: list[pulumi.Resource] = field(default_factory=list)


def _trust(parts: list[str]) -> str:
    oidc_arn, issuer = parts
    host = issuer.removeprefix("https://")
    policy = irsa_trust_policy(oidc_arn, host, SYSTEM_NAMESPACE, b.SERVICE_ACCOUNT)
    return json.dumps(policy, sort_keys=True)


def _policy(key_arn: str, bucket: str) -> str:
    return json.dumps(b.collector_s3_policy(bucket, key_arn), sort_keys=True)


class LogCollector(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: LogCollectorArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:logs:LogCollector", name, None, opts)
        cfg = args.config
        depends_on: list[pulumi.Resource] = list(args.depends_on)
        values: dict[str, Any]
        if args.aws is not None:
            access = args.aws
            on_aws = pulumi.ResourceOptions(parent=self, provider=access.provider)
            role = aws.iam.Role(
                f"{name}-role",
                assume_role_policy=pulumi.Output.all(
                    access.oidc_provider_arn, access.oidc_issuer_url
                ).apply(_trust),
                opts=on_aws,
            )
            depends_on.append(
                aws.iam.RolePolicy(
                    f"{name}-policy",
                    role=role.name,
                    policy=pulumi.Output.from_input(access.key_arn).apply(
                        partial(_policy, bucket=args.bucket)
                    ),
                    opts=on_aws,
                )
            )
            values = b.collector_values(args.bucket, args.region)
            values["serviceAccount"]["annotations"] = {"eks.amazonaws.com/role-arn": role.arn}
        else:
            store = cfg.storage.object_store
            assert store is not None, "an existing cluster's collector writes to objectStore"
            values = b.collector_values(
                args.bucket,
                args.region,
                endpoint=store.endpoint,
                credentials_secret=store.collector_secret,
            )
        addon_release(
            f"{name}-release",
            b.RELEASE,
            cfg,
            values=values,
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.k8s_provider, depends_on=depends_on
            ),
        )
        self.register_outputs({})
