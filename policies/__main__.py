"""The CrossGuard pack; the Pulumi CLI runs this file (constructing the pack serves it)."""

from pulumi_policy import EnforcementLevel, PolicyPack

from trainstack.policy.pack import PACK_NAME, crossguard_policies

PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=crossguard_policies(),
)
