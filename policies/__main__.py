"""The CrossGuard pack; the Pulumi CLI runs this file (constructing the pack serves it)."""

from pulumi_policy import EnforcementLevel, PolicyPack

try:
    from trainstack.policy.pack import PACK_NAME, crossguard_policies
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] != "trainstack":
        raise
    # Not an exception: pulumi.policy's runner would log it as a crash with a traceback.
    raise SystemExit(
        f"trainstack policy pack: {missing}. The pack runs in the repository's .venv "
        "(PulumiPolicy.yaml `virtualenv: ../.venv`), which `make setup` creates with trainstack "
        "installed; it is local-only (policies/README.md)."
    ) from None

PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=crossguard_policies(),
)
