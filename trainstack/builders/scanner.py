"""Accepted findings of the security scanner, written on the object they concern (issue 37).

`make test` runs checkov (its version pinned in tests/conformance/checkov-constraints.txt)
over every Kubernetes object the example stacks generate and fails on any finding that has no
exception here (tests/conformance/test_security_scan.py). An exception is an annotation in
checkov's own format, which checkov reads from the object's own `metadata.annotations` only,
never from a pod template's (checkov 3.3.30 checkov/kubernetes/kubernetes_utils.py
`get_skipped_checks`: any key containing `checkov.io/skip`, the value `<CHECK_ID>=<reason>`).
It splits the value at every `=`, so a reason containing one crashes the scan: `exception`
refuses it. One check per key, `checkov.io/skip-<CHECK_ID>`, so a key never depends on the
order of the others and a golden diff names the check.

Each reason says why the finding is accepted and cites its source (the Kubernetes, containerd
or upstream code at the version the platform pins, or the builder that holds the facts), so a
reviewer can check it without asking. The scan also fails on an exception whose finding is
gone: one is written only where the finding is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trainstack.config.images import is_pinned

ANNOTATION_PREFIX: Final = "checkov.io/skip-"
CHECK_ID: Final = re.compile(r"CKV2?_K8S_[0-9]+")
MIN_REASON: Final = 40  # a sentence with its source, not "needed" or "by design"

# checkov's CKV_K8S_43 (image by digest) and CKV_K8S_15 (imagePullPolicy Always for an image
# without one) on a platform image given as a tag, which only a stack outside production may
# do: the loader requires a digest for every platform image in production.
UNPINNED_IMAGE: Final = {
    "CKV_K8S_43": (
        "a build tag outside production; production stacks must pin this image by digest "
        "(config/images.py PLATFORM_IMAGES and is_pinned)"
    ),
    "CKV_K8S_15": (
        "a build tag outside production, pulled if not present like any tag; production "
        "stacks pin it by digest instead (config/images.py PLATFORM_IMAGES)"
    ),
}


def reason_issue(check_id: str, reason: str) -> str | None:
    """Why checkov would not read `<check_id>=<reason>` as one exception with a reason."""
    if not CHECK_ID.fullmatch(check_id):
        return f"{check_id!r} is not a checkov Kubernetes check id (CKV_K8S_<n> or CKV2_K8S_<n>)"
    if "=" in reason:
        return f"{check_id}: the reason contains '=', which crashes checkov; reword it"
    if "\n" in reason or reason != reason.strip():
        return f"{check_id}: the reason must be one line without surrounding blanks"
    if len(reason) < MIN_REASON:
        return f"{check_id}: {reason!r} is too short to be a reason: say why, and cite the source"
    return None


def exception(check_id: str, reason: str) -> tuple[str, str]:
    """One accepted finding as checkov's annotation: (key, value)."""
    issue = reason_issue(check_id, reason)
    if issue is not None:
        raise ValueError(issue)
    return f"{ANNOTATION_PREFIX}{check_id}", f"{check_id}={reason}"


def _order(check_id: str) -> tuple[str, int]:
    family, _, number = check_id.rpartition("_")
    return family, int(number)


def exceptions(reasons: Mapping[str, str]) -> dict[str, str]:
    """Annotations for several accepted findings, in check order (CKV_K8S_9 before _16)."""
    return dict(exception(c, reasons[c]) for c in sorted(reasons, key=_order))


def annotate(metadata: dict[str, Any], reasons: Mapping[str, str]) -> dict[str, Any]:
    """An object's `metadata` with the exceptions added to its annotations (in place): the
    object's own, never its pod template's, which checkov does not read."""
    if reasons:
        metadata["annotations"] = {**metadata.get("annotations", {}), **exceptions(reasons)}
    return metadata


def unpinned_image_reasons(images: Iterable[str]) -> dict[str, str]:
    """The digest exceptions for a workload some of whose images are not pinned by digest
    (a stack outside production); none when every image is."""
    if all(is_pinned(image, production=True) for image in images):
        return {}
    return dict(UNPINNED_IMAGE)
