"""The platform's rules as in-cluster admission policies for team namespaces."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainstack.components.kube import apply_manifest
from trainstack.config.model import PlatformConfig
from trainstack.policy.admission import admission_policies
from trainstack.policy.settings import rule_config


@dataclass(frozen=True)
class AdmissionPoliciesArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource


class AdmissionPolicies(pulumi.ComponentResource):
    """So that work submitted with kubectl meets the same rules as the preview checks."""

    def __init__(
        self, name: str, args: AdmissionPoliciesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:policy:AdmissionPolicies", name, None, opts)
        cfg = args.config
        child = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        manifests = admission_policies(rule_config(cfg), cfg.stack, frozenset(cfg.policy.advisory))
        for manifest in manifests:
            kind = "binding" if manifest["kind"].endswith("Binding") else "policy"
            rule = manifest["metadata"]["name"].removeprefix("trainstack-rule-")
            apply_manifest(f"{name}-{rule}-{kind}", manifest, child)
        self.register_outputs({})
