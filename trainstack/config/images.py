"""Image references: what pins one (by digest, or by a tag that names a build), for team
images and the platform's own alike.

One definition for the job spec, the platform config, the policy rule `pinned-images` and its
CEL twin (policy/admission.py reads the patterns), and the security scanner's exceptions
(builders/scanner.py). It lives with the config, the lowest layer that needs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainstack.config import k8s_syntax
from trainstack.config.errors import ConfigIssue, join_path

# A tag (never :latest, checked apart) or a full sha256 digest. The name part has no `@`, so
# `name@sha256:abc` is not read as the tag `abc`. Shared by the job spec, this rule and its
# CEL admission policy (RE2 accepts it as is).
PINNED_IMAGE = re.compile(r"^[^@\s]+(@sha256:[a-f0-9]{64}|:[^/:@\s]+)$")
DIGEST = re.compile(r"^[^@\s]+@sha256:[a-f0-9]{64}$")
# Tags that name a branch or a channel, not a build: they move under a running job (a restart
# pulls other code). Any tag can be re-pushed; production therefore takes digests only.
MOVING_TAGS = ("latest", "main", "master", "head", "trunk", "dev", "develop", "nightly", "edge",
               "stable", "canary")  # fmt: skip
MOVING_TAG = re.compile(r"^[^@]*:(" + "|".join(MOVING_TAGS) + r")$")


def pin_required(production: bool) -> str:
    """What `is_pinned` asks of an image, in words, for messages."""
    return "a digest (production)" if production else "a build tag or a digest"


def is_pinned(image: str, *, production: bool = False) -> bool:
    """Pinned: by a digest; outside production also by a tag that names a build (not one of
    MOVING_TAGS). One definition for the job spec, the rule and its CEL twin."""
    # fullmatch: `$` alone would also match before a final newline, where RE2 (CEL) does not.
    if DIGEST.fullmatch(image):
        return True
    return (
        not production and bool(PINNED_IMAGE.fullmatch(image)) and not MOVING_TAG.fullmatch(image)
    )


def from_allowed_registry(image: str, allowed: tuple[str, ...] | list[str]) -> bool:
    """Whether `image` starts with one of the `allowed` prefixes (none: any image). One
    definition for the `pinned-images` rule (its CEL twin: `startsWith` over the same list)
    and image pre-pull's choice of the team jobs' images (jobs/prepull.py)."""
    return not allowed or any(image.startswith(prefix) for prefix in allowed)


def registry_prefix_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """`policy.allowedRegistries` are matched as string prefixes (the rule and its CEL twin,
    `startsWith`), so each must end where a registry host or a repository path ends, at a `/`:
    `registry.example.com` would also admit `registry.example.com.attacker.net/…`, another
    registry, and `…/team-a` the repositories of `…/team-abc` (the image reference grammar puts
    the registry host before the first `/`: github.com/distribution/reference v0.6.0
    normalize.go splitDockerDomain)."""
    policy = doc.get("policy")
    allowed = policy.get("allowedRegistries") if isinstance(policy, Mapping) else None
    if not isinstance(allowed, list):
        return []
    issues = []
    for index, prefix in enumerate(allowed):
        if isinstance(prefix, str) and prefix and not prefix.endswith("/"):
            issues.append(
                ConfigIssue(
                    join_path(root, "policy", "allowedRegistries", index),
                    f"{prefix!r} is a prefix, so it also allows {prefix}.attacker.net/… or "
                    f"{prefix}-other/…: end it with / ({prefix + '/'!r})",
                )
            )
    return issues


# The platform's own images (issue 37: pinned by digest in production, like team images):
# (path in the platform document, what builds it, whether the document uses it).
PLATFORM_IMAGES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("scheduling", "deadlines", "image"), "build images/deadlines, push it to your "
     "registry and set image: <registry>/trainstack/deadlines@sha256:… (docs/deadlines.md)"),
    (("storage", "nvmeCache", "agentImage"), "build images/prewarm, push it to your "
     "registry and set agentImage: <registry>/trainstack/prewarm@sha256:… (docs/prewarm.md)"),
    (("storage", "nvmeCache", "registrarImage"), "mirror "
     "registry.k8s.io/sig-storage/csi-node-driver-registrar and set registrarImage: "
     "<registry>/csi-node-driver-registrar@sha256:…"),
    (("storage", "layoutImage"), "build images/prewarm, push it to your registry and set "
     "layoutImage: <registry>/trainstack/prewarm@sha256:… (docs/security.md)"),
    (("health", "image"), "build images/health, push it to your registry and set "
     "image: <registry>/trainstack/health@sha256:… (docs/health.md)"),
    (("prePull", "holderImage"), "mirror busybox (a static build) to your registry and set "
     "holderImage: <registry>/busybox@sha256:… (docs/prepull.md)"),
)  # fmt: skip


def _image_in_use(doc: Mapping[str, Any], where: tuple[str, ...]) -> tuple[bool, object]:
    """(whether the platform runs the image at `where`, its value if set)."""
    node: object = doc
    for key in where[:-1]:
        node = node.get(key) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping):
        return where[0] == "scheduling", None  # the enforcer runs on every platform
    if where == ("storage", "layoutImage"):  # runs where there is a shared file system
        return "lustre" in node or "existingLustre" in node, node.get(where[-1])
    if where in (("health", "image"), ("prePull", "holderImage")):  # only when turned on
        return node.get("enabled") is True, node.get(where[-1])
    return True, node.get(where[-1])


def platform_image_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """Images the platform runs itself are pinned as team images are (is_pinned):
    by digest in production, by a build tag otherwise (issue 19 #4, issue 37)."""
    production = doc.get("environment") == "production"
    issues: list[ConfigIssue] = []
    for where, fix in PLATFORM_IMAGES:
        used, image = _image_in_use(doc, where)
        if not used:
            continue
        path = join_path(root, *where)
        if image is None and production:  # the default is a tag nobody published, or moves
            message = f"not set; production pins its images by digest: {fix}"
            issues.append(ConfigIssue(path, message))
        elif (
            isinstance(image, str)
            and not k8s_syntax.image_reference(image)  # a malformed one: the schema says so
            and not is_pinned(image, production=production)
        ):
            pin = pin_required(production)
            issues.append(ConfigIssue(path, f"{image!r} is not pinned by {pin}: {fix}"))
    return issues
