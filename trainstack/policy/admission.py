"""The Kubernetes rules as ValidatingAdmissionPolicies (CEL), for kubectl-submitted work.

Each expression states the same rule as the Python function of the same name in
rules.py; tests evaluate both on the same objects and require the same verdict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from trainstack.builders import labels
from trainstack.builders.admission import VOLCANO_JOBS, team_policy
from trainstack.config.images import DIGEST, MOVING_TAG, PINNED_IMAGE
from trainstack.policy.isolation import (
    CACHE_DRIVER,
    DATASETS_CLAIM,
    GPU_TAINT_KEY,
    HEALTH_TAINT_KEY,
    PINNED_CPU_LIMIT,
    PINNED_KEY,
    PINNED_MEMORY_LIMIT,
    PINNED_RESOURCES,
    PINNED_VALUE,
    PLUGINS,
    POOL_LABEL,
    PYTORCH_ARG,
    SCHEDULING_KEY_PREFIXES,
    SCHEDULING_KEYS,
    SHARED_GPUS_ALLOW,
    SHARED_GPUS_ANNOTATION,
    SVC_PLUGIN_ARGS,
    VOLCANO_SCHEDULER,
)
from trainstack.policy.objects import (
    DEVICE_PREFIXES,
    DEVICE_RESOURCES,
    Config,
)
from trainstack.policy.pod_security import (
    APPARMOR_ANNOTATION,
    BASELINE_CAPABILITIES,
    BASELINE_SELINUX_TYPES,
    BASELINE_SYSCTLS,
    CONFINED_PROFILES,
    HANDLERS,
    PROBES,
    RESTRICTED_CAPABILITIES,
    RESTRICTED_VOLUMES,
)
from trainstack.policy.rules import (
    CHECKPOINT_ENV,
    CHECKPOINT_PATH,
    K8S_RULES,
    MAX_DURATION_ANNOTATION,
    UPDATE_READS,
)
from trainstack.slices import MIG_RESOURCE_PREFIX, SHARED_RESOURCE, WHOLE_GPU_RESOURCE

POLICY_PREFIX = "trainstack-rule-"


def _str(value: str) -> str:
    return json.dumps(value)  # a CEL string literal (JSON escaping is valid CEL)


def _list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_str(v) for v in values) + "]"


def _each_container(body: str) -> str:
    """BODY (over `c`) holds for every container and init container of every task."""
    return (
        f"variables.pods.all(p, p.containers.all(c, {body}) && "
        f"(!has(p.initContainers) || p.initContainers.all(c, {body})))"
    )


def _is_device(key: str) -> str:
    named = " || ".join(f"{key} == {_str(r)}" for r in DEVICE_RESOURCES)
    prefixed = " || ".join(f"{key}.startsWith({_str(p)})" for p in DEVICE_PREFIXES)
    return f"({named} || {prefixed})"


def _q(expr: str) -> str:
    return f"quantity(string({expr})).asApproximateFloat()"


def _datasets_mounts(body: str) -> str:
    """BODY (over `m`) holds for every mount, in any container, of a volume on the datasets
    claim (`v`)."""
    mounts = f"!has(c.volumeMounts) || c.volumeMounts.all(m, m.name != v.name || ({body}))"
    return (
        "variables.pods.all(p, !has(p.volumes) || p.volumes.all(v, "
        "!has(v.persistentVolumeClaim) || "
        f"v.persistentVolumeClaim.claimName != {_str(DATASETS_CLAIM)} || "
        f"(p.containers.all(c, {mounts}) && "
        f"(!has(p.initContainers) || p.initContainers.all(c, {mounts})))))"
    )


def _pod_volumes() -> str:
    """rules.pod_volumes."""
    volume = (
        "!has(v.ephemeral) && "
        f"(!has(v.csi) || (v.csi.driver == {_str(CACHE_DRIVER)} && has(v.csi.readOnly) && "
        "v.csi.readOnly)) && "
        "(!has(v.persistentVolumeClaim) || "
        f"v.persistentVolumeClaim.claimName != {_str(DATASETS_CLAIM)} || "
        "(has(v.persistentVolumeClaim.readOnly) && v.persistentVolumeClaim.readOnly))"
    )
    return (
        f"variables.pods.all(p, !has(p.volumes) || p.volumes.all(v, {volume})) && "
        + _datasets_mounts("has(m.readOnly) && m.readOnly")
    )


def _reserved(key: str) -> str:
    prefixes = " || ".join(f"{key}.startsWith({_str(p)})" for p in SCHEDULING_KEY_PREFIXES)
    return f"({prefixes} || {key} in {_list(SCHEDULING_KEYS)})"


def _pinned_container(c: str) -> str:
    """isolation._pinned_pod over one container `c`: no DRA claim, cpu and memory alone,
    limits of both within the bounds (Kubernetes' quantity library; isQuantity first, so
    that an unparsable value is refused with the rule's message, not an evaluation error)."""
    res, allowed = f"{c}.resources", _list(PINNED_RESOURCES)
    bounds = " && ".join(
        f"{_str(k)} in {res}.limits && isQuantity(string({res}.limits[{_str(k)}])) && "
        f"quantity(string({res}.limits[{_str(k)}])).compareTo(quantity({_str(bound)})) <= 0"
        for k, bound in (("cpu", PINNED_CPU_LIMIT), ("memory", PINNED_MEMORY_LIMIT))
    )
    return (
        f"has({res}) && !has({res}.claims) && "
        f"(!has({res}.requests) || {res}.requests.all(k, k in {allowed})) && "
        f"has({res}.limits) && {res}.limits.all(k, k in {allowed}) && {bounds}"
    )


def _pinned_task(t: str) -> str:
    """isolation._pinned_pod: task `t` is one replica of a small CPU pod."""
    pod = f"{t}.template.spec"
    return (
        f"has({t}.replicas) && {t}.replicas == 1 && !has({pod}.resourceClaims) && "
        f"!has({pod}.resources) && size({pod}.containers) == 1 && "
        f"{pod}.containers.all(c, {_pinned_container('c')}) && "
        f"(!has({pod}.initContainers) || {pod}.initContainers.all(c, "
        f"!has(c.restartPolicy) && {_pinned_container('c')}))"
    )


def _scheduling_keys() -> str:
    """rules.scheduling_keys: the Job's and its templates' labels and annotations, but
    PINNED_KEY: "false" in the template annotations of at most one task, a small CPU pod."""

    def clean(meta: str, exempt: str = "") -> str:
        return " && ".join(
            f"(!has({meta}.{kind}) || {meta}.{kind}.all(k, !{_reserved('k')}"
            f"{exempt if kind == 'annotations' else ''}))"
            for kind in ("labels", "annotations")
        )

    key = _str(PINNED_KEY)
    ann = "t.template.metadata.annotations"
    pinned = f"has(t.template.metadata) && has({ann}) && {key} in {ann}"
    return (
        f"{clean('object.metadata')} && object.spec.tasks.all(t, "
        f"!has(t.template.metadata) || ({clean('t.template.metadata', f' || k == {key}')})) && "
        f"object.spec.tasks.all(t, !({pinned}) || ({ann}[{key}] == {_str(PINNED_VALUE)} && "
        f"{_pinned_task('t')})) && size(object.spec.tasks.filter(t, {pinned})) <= 1"
    )


def _job_plugins() -> str:
    """rules.job_plugins / plugin_args_ok."""
    args = "object.spec.plugins[n]"
    pytorch = (
        f"{args}.all(a, a.matches({_str('^' + PYTORCH_ARG.pattern + '$')})) && "
        + " && ".join(
            f"size({args}.filter(a, a.startsWith({_str(f'--{k}=')}))) <= 1"
            for k in ("master", "worker", "port")
        )
    )
    return (
        f"!has(object.spec.plugins) || object.spec.plugins.all(n, n in {_list(PLUGINS)} && "
        f"(n == 'env' ? size({args}) == 0 : n == 'svc' ? {args} == {_list(SVC_PLUGIN_ARGS)} : "
        f"({pytorch})))"
    )


def _first_container_mount(path: str, volume_test: str) -> str:
    """The first container mounts PATH from a volume satisfying VOLUME_TEST (over `v`)."""
    return (
        "variables.pods.all(p, has(p.containers[0].volumeMounts) && "
        f"p.containers[0].volumeMounts.exists(m, m.mountPath == {_str(path)} && "
        f"has(p.volumes) && p.volumes.exists(v, v.name == m.name && {volume_test})))"
    )


def expressions(cfg: Config) -> dict[str, str]:
    """CEL per rule name, with this stack's thresholds baked in."""
    ratio = " && ".join(
        f"(({_str(n)} in c.resources.limits && {_str(n)} in c.resources.requests) ? "
        f"{_q('c.resources.limits[' + _str(n) + ']')} <= {bound!r} * "
        f"{_q('c.resources.requests[' + _str(n) + ']')} + 1e-9 : true)"
        for n, bound in (
            ("cpu", float(cfg.max_cpu_limit_request_ratio)),
            ("memory", float(cfg.max_memory_limit_request_ratio)),
        )
    )
    devices = (
        "!has(c.resources) || ((!has(c.resources.limits) || c.resources.limits.all(k, "
        f"!{_is_device('k')} || (has(c.resources.requests) && k in c.resources.requests && "
        "quantity(string(c.resources.requests[k])).compareTo("
        "quantity(string(c.resources.limits[k]))) == 0))) && "
        "(!has(c.resources.requests) || c.resources.requests.all(k, "
        f"!{_is_device('k')} || (has(c.resources.limits) && k in c.resources.limits))))"
    )
    ns_ann = "namespaceObject.metadata.annotations"
    team_max = _str(labels.TEAM_MAX_JOB_HOURS_ANNOTATION)
    duration = _str(MAX_DURATION_ANNOTATION)
    limit_hours = (
        f"((has({ns_ann}) && {team_max} in {ns_ann}) ? double({ns_ann}[{team_max}]) : "
        f"{float(cfg.max_duration_hours)!r})"
    )
    ann = "object.metadata.annotations"
    interval_names = " || ".join(f"e.name == {_str(n)}" for n in CHECKPOINT_ENV)
    registries = tuple(cfg.allowed_registries)
    digest = f"c.image.matches({_str(DIGEST.pattern)})"
    build_tag = (
        f"c.image.matches({_str(PINNED_IMAGE.pattern)}) && "
        f"!c.image.matches({_str(MOVING_TAG.pattern)})"
    )
    pinned = (digest if cfg.production else f"({digest} || ({build_tag}))") + (
        f" && {_list(registries)}.exists(r, c.image.startsWith(r))" if registries else ""
    )
    return {
        "request-limit-ratio": _each_container(
            "!has(c.resources) || !has(c.resources.limits) || !has(c.resources.requests) || "
            f"({ratio})"
        ),
        "devices-requests-equal-limits": _each_container(devices),
        "max-duration": (
            f"has({ann}) && {duration} in {ann} && double({ann}[{duration}]) > 0.0 && "
            f"double({ann}[{duration}]) <= {limit_hours} * 3600.0"
        ),
        "checkpoint-volume": (
            _first_container_mount(CHECKPOINT_PATH, "has(v.persistentVolumeClaim)")
            + " && variables.pods.all(p, has(p.containers[0].env) && p.containers[0].env.exists(e, "
            f"({interval_names}) && has(e.value) && e.value.matches('^[0-9]+$') && "
            "int(e.value) > 0))"
        ),
        "pinned-images": _each_container(pinned),
        "gpu-placement": _gpu_placement(cfg),
        "health-gate": (
            "variables.pods.all(p, !has(p.tolerations) || !p.tolerations.exists(t, "
            "(!has(t.effect) || t.effect in ['', 'NoSchedule']) && "
            f"((has(t.key) && t.key == {_str(HEALTH_TAINT_KEY)}) || ((!has(t.key) || t.key == '') "
            "&& has(t.operator) && t.operator == 'Exists'))))"
        ),
        "hardened-pods": _hardened(),
        "limits-set": _each_container(
            "has(c.resources) && has(c.resources.limits) && 'cpu' in c.resources.limits && "
            "'memory' in c.resources.limits"
        ),
        "own-queue": "has(object.spec.queue) && object.spec.queue == namespaceObject.metadata.name",
        "shared-gpus": _shared_gpus(),
        "pod-volumes": _pod_volumes(),
        "job-volumes": "!has(object.spec.volumes) || size(object.spec.volumes) == 0",
        "scheduling-keys": _scheduling_keys(),
        "job-plugins": _job_plugins(),
        "volcano-scheduled": (
            "(!has(object.spec.schedulerName) || object.spec.schedulerName in "
            f"['', {_str(VOLCANO_SCHEDULER)}]) && {_team_priority()} && variables.pods.all(p, "
            f"(!has(p.schedulerName) || p.schedulerName in ['', {_str(VOLCANO_SCHEDULER)}]) && "
            "(!has(p.priorityClassName) || p.priorityClassName == '') && "
            "(!has(p.nodeName) || p.nodeName == ''))"
        ),
        "shm-sized": _first_container_mount(
            "/dev/shm",
            "has(v.emptyDir) && has(v.emptyDir.medium) && v.emptyDir.medium == 'Memory' && "
            "has(v.emptyDir.sizeLimit)",
        ),
        "no-privileged": (
            "variables.pods.all(p, !(has(p.hostNetwork) && p.hostNetwork) && "
            "!(has(p.hostPID) && p.hostPID) && !(has(p.hostIPC) && p.hostIPC) && "
            "(!has(p.volumes) || p.volumes.all(v, !has(v.hostPath))))"
            " && "
            + _each_container(
                "!(has(c.securityContext) && has(c.securityContext.privileged) && "
                "c.securityContext.privileged)"
            )
            + " && "
            + _baseline()
        ),
    }


def _shared_gpus() -> str:
    """isolation.shared_gpus: at most one time-shared GPU per container, and more than one
    holder in the job only with the Job's annotation. sum() is Kubernetes' CEL lists library
    (k8s.io/apiserver v0.37.2 pkg/cel/library/lists.go, in every environment since 1.27)."""
    res = _str(SHARED_RESOURCE)
    has_it = f"has(c.resources) && has(c.resources.limits) && {res} in c.resources.limits"
    one = (
        f"!({has_it}) || (isQuantity(string(c.resources.limits[{res}])) && "
        f"quantity(string(c.resources.limits[{res}])).compareTo(quantity('1')) <= 0)"
    )
    each = (
        f"t.template.spec.containers.all(c, {one}) && "
        f"(!has(t.template.spec.initContainers) || t.template.spec.initContainers.all(c, {one}))"
    )
    holders_in = (
        f"size(t.template.spec.containers.filter(c, {has_it})) + "
        f"(has(t.template.spec.initContainers) ? "
        f"size(t.template.spec.initContainers.filter(c, {has_it})) : 0)"
    )
    holders = (
        f"object.spec.tasks.map(t, (has(t.replicas) ? int(t.replicas) : 1) * ({holders_in})).sum()"
    )
    ann, key = "object.metadata.annotations", _str(SHARED_GPUS_ANNOTATION)
    allowed = f"(has({ann}) && {key} in {ann} && {ann}[{key}] == {_str(SHARED_GPUS_ALLOW)})"
    return f"object.spec.tasks.all(t, {each}) && ({allowed} || {holders} <= 1)"


def _team_priority() -> str:
    """rules.volcano_scheduled's priority check: the namespace's annotation lists the short
    names of the classes the team may use (builders/platform.team_namespace)."""
    ann = "namespaceObject.metadata.annotations"
    key = _str(labels.TEAM_PRIORITY_ANNOTATION)
    return (
        "(!has(object.spec.priorityClassName) || object.spec.priorityClassName == '' || "
        f"!has({ann}) || !({key} in {ann}) || {ann}[{key}].split(',').exists(c, "
        "'trainstack-' + c == object.spec.priorityClassName))"
    )


def _wants_gpu(p: str) -> str:
    """isolation.wants_gpu: a limit on a whole, MIG or time-shared GPU."""
    gpu = (
        f"k == {_str(WHOLE_GPU_RESOURCE)} || k == {_str(SHARED_RESOURCE)} || "
        f"k.startsWith({_str(MIG_RESOURCE_PREFIX)})"
    )
    has_gpu = f"has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(k, {gpu})"
    return (
        f"({p}.containers.exists(c, {has_gpu}) || "
        f"(has({p}.initContainers) && {p}.initContainers.exists(c, {has_gpu})))"
    )


def _selectors(selectors: Sequence[Mapping[str, str]]) -> str:
    """A CEL list of maps: the pools' node labels."""
    return "[" + ", ".join(
        "{" + ", ".join(f"{_str(k)}: {_str(v)}" for k, v in sorted(sel.items())) + "}"
        for sel in selectors
    ) + "]"  # fmt: skip


def _gpu_placement(cfg: Config) -> str:
    """rules.gpu_placement: tolerates_gpu, targets_pool and the GPU-job exception."""
    tolerates = (
        "(has(p.tolerations) && p.tolerations.exists(t, "
        "(!has(t.effect) || t.effect in ['', 'NoSchedule']) && "
        f"((has(t.key) && t.key == {_str(GPU_TAINT_KEY)}) || ((!has(t.key) || t.key == '') && "
        "has(t.operator) && t.operator == 'Exists'))))"
    )
    if cfg.pool_selectors:
        pools = _selectors(cfg.pool_selectors)
        if cfg.pools:
            # The team's pools, by the namespace's annotation (builders/platform.py); a
            # namespace without it may use any pool (rules: Config.team_pool_selectors).
            named = sorted(cfg.pools.items())
            entries = [f"{_str(name)}: {_selectors([sel])[1:-1]}" for name, sel in named]
            by_name = "{" + ", ".join(entries) + "}"
            ann, key = "namespaceObject.metadata.annotations", _str(labels.TEAM_POOLS_ANNOTATION)
            pools = (
                f"((has({ann}) && {key} in {ann}) ? {ann}[{key}].split(',')"
                f".filter(n, n in {by_name}).map(n, {by_name}[n]) : {pools})"
            )
        by_selector = (
            f"{pools}.exists(s, s.all(k, k in p.nodeSelector && p.nodeSelector[k] == s[k]))"
        )
        by_term = (
            f"{pools}.exists(s, s.all(k, has(t.matchExpressions) && t.matchExpressions.exists(e, "
            "e.key == k && e.operator == 'In' && has(e.values) && e.values == [s[k]])))"
        )
    else:
        pool = _str(POOL_LABEL)
        by_selector = f"{pool} in p.nodeSelector"
        by_term = (
            "has(t.matchExpressions) && t.matchExpressions.exists(e, "
            f"e.key == {pool} && e.operator == 'In' && has(e.values) && size(e.values) > 0)"
        )
    required = "p.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    targets = (
        f"((has(p.nodeSelector) && {by_selector}) || (has(p.affinity) && "
        f"has(p.affinity.nodeAffinity) && has({required}) && "
        f"size({required}.nodeSelectorTerms) > 0 && "
        f"{required}.nodeSelectorTerms.all(t, {by_term})))"
    )
    gpu_job = f"variables.pods.exists(q, {_wants_gpu('q')})"
    return (
        f"variables.pods.all(p, {_wants_gpu('p')} ? ({tolerates} && {targets}) : "
        f"(!{tolerates} || {gpu_job}))"
    )


def _hardened_container() -> str:
    """pod_security._hardened_container over `c` in pod `p`."""
    sc, psc = "c.securityContext", "p.securityContext"
    profiles = _list(CONFINED_PROFILES)
    return (
        f"has({sc}) && has({sc}.allowPrivilegeEscalation) && !{sc}.allowPrivilegeEscalation && "
        f"has({sc}.capabilities) && has({sc}.capabilities.drop) && "
        f"'ALL' in {sc}.capabilities.drop && (!has({sc}.capabilities.add) || "
        f"{sc}.capabilities.add.all(x, x in {_list(sorted(RESTRICTED_CAPABILITIES))})) && "
        f"(has({sc}.seccompProfile) ? (has({sc}.seccompProfile.type) && "
        f"{sc}.seccompProfile.type in {profiles}) : (has({psc}) && "
        f"has({psc}.seccompProfile) && has({psc}.seccompProfile.type) && "
        f"{psc}.seccompProfile.type in {profiles})) && "
        f"(has({sc}.runAsNonRoot) ? {sc}.runAsNonRoot : (has({psc}) && "
        f"has({psc}.runAsNonRoot) && {psc}.runAsNonRoot)) && "
        f"(!has({sc}.runAsUser) || {sc}.runAsUser != 0)"
    )


def _hardened() -> str:
    """pod_security.hardened_pods."""
    volumes = " || ".join(f"has(v.{k})" for k in RESTRICTED_VOLUMES)
    return (
        "variables.pods.all(p, has(p.automountServiceAccountToken) && "
        "!p.automountServiceAccountToken && !(has(p.securityContext) && "
        "has(p.securityContext.runAsUser) && p.securityContext.runAsUser == 0) && "
        f"(!has(p.volumes) || p.volumes.all(v, {volumes})) && "
        f"p.containers.all(c, {_hardened_container()}) && (!has(p.initContainers) || "
        f"p.initContainers.all(c, {_hardened_container()})))"
    )


def _confined(sc: str) -> str:
    """The securityContext `sc` keeps seccomp, AppArmor and SELinux confinement and is no
    Windows host process (pod_security._baseline)."""
    profiles = _list(CONFINED_PROFILES)
    se = f"{sc}.seLinuxOptions"
    return (
        f"(!has({sc}.seccompProfile) || {sc}.seccompProfile.type in {profiles}) && "
        f"(!has({sc}.appArmorProfile) || {sc}.appArmorProfile.type in {profiles}) && "
        f"(!has({se}) || ((!has({se}.type) || {se}.type in {_list(BASELINE_SELINUX_TYPES)}) && "
        f"(!has({se}.user) || {se}.user == '') && (!has({se}.role) || {se}.role == ''))) && "
        f"(!has({sc}.windowsOptions) || !has({sc}.windowsOptions.hostProcess) || "
        f"!{sc}.windowsOptions.hostProcess)"
    )


def _no_host(handler: str) -> str:
    """Probe or lifecycle handler `handler` sets no host."""
    return " && ".join(
        f"(!has({handler}.{h}) || !has({handler}.{h}.host) || {handler}.{h}.host == '')"
        for h in HANDLERS
    )


def _baseline() -> str:
    """Pod Security baseline beyond host namespaces, privileged and hostPath
    (pod_security._baseline): over every pod, container and the templates' AppArmor
    annotations."""
    sc = "c.securityContext"
    container = (
        f"(!has({sc}) || ({_confined(sc)} && (!has({sc}.capabilities) || "
        f"!has({sc}.capabilities.add) || {sc}.capabilities.add.all(x, x in "
        f"{_list(sorted(BASELINE_CAPABILITIES))})) && (!has({sc}.procMount) || "
        f"{sc}.procMount == 'Default' || (has(p.hostUsers) && !p.hostUsers)))) && "
        "(!has(c.ports) || c.ports.all(q, !has(q.hostPort) || q.hostPort == 0)) && "
        + " && ".join(f"(!has(c.{k}) || ({_no_host('c.' + k)}))" for k in PROBES)
        + " && (!has(c.lifecycle) || ("
        + " && ".join(
            f"(!has(c.lifecycle.{k}) || ({_no_host('c.lifecycle.' + k)}))"
            for k in ("postStart", "preStop")
        )
        + "))"
    )
    pod = (
        "variables.pods.all(p, !has(p.securityContext) || "
        f"({_confined('p.securityContext')} && (!has(p.securityContext.sysctls) || "
        f"p.securityContext.sysctls.all(s, s.name in {_list(sorted(BASELINE_SYSCTLS))}))))"
    )
    ann = "t.template.metadata.annotations"
    annotations = (
        "object.spec.tasks.all(t, !has(t.template.metadata) || "
        f"!has({ann}) || {ann}.all(k, !k.startsWith({_str(APPARMOR_ANNOTATION)}) || "
        f"{ann}[k] in ['', 'runtime/default'] || {ann}[k].startsWith('localhost/')))"
    )
    return f"{pod} && {_each_container(container)} && {annotations}"


PODS_VARIABLE = {"name": "pods", "expression": "object.spec.tasks.map(t, t.template.spec)"}


def _inputs(rule: str, o: str) -> list[str]:
    """rules.update_inputs of the object `o` (`object` or `oldObject`), as CEL terms."""
    templates = f"{o}.spec.tasks.map(t, t.template)"
    reads = UPDATE_READS.get(rule, "templates")
    if reads == "annotation":
        ann, key = f"{o}.metadata.annotations", _str(MAX_DURATION_ANNOTATION)
        return [f"((has({ann}) && {key} in {ann}) ? {ann}[{key}] : '')"]
    if reads == "queue":
        return [f"(has({o}.spec.queue) ? {o}.spec.queue : '')"]
    if reads == "scheduler":
        return [
            f"(has({o}.spec.schedulerName) ? {o}.spec.schedulerName : '')",
            f"(has({o}.spec.priorityClassName) ? {o}.spec.priorityClassName : '')",
            templates,
        ]
    if reads == "volumes":
        return [f"(has({o}.spec.volumes) ? {o}.spec.volumes : [])"]
    if reads == "plugins":
        return [f"(has({o}.spec.plugins) ? {o}.spec.plugins : {{}})"]
    return [templates]


def judged(rule: str) -> dict[str, str] | None:
    """The matchCondition of a rule's policy: every CREATE, and an UPDATE that changes what
    the rule reads (rules.judged_on_update; issue 19 #8). None: every request."""
    if UPDATE_READS.get(rule) == "always":
        return None
    changed = " || ".join(
        f"{new} != {old}"
        for new, old in zip(_inputs(rule, "object"), _inputs(rule, "oldObject"), strict=True)
    )
    return {"name": "created-or-inputs-changed", "expression": (
        f"request.operation != 'UPDATE' || {changed}"
    )}  # fmt: skip


def admission_policies(
    cfg: Config, stack: str, advisory: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its Binding per rule, for team namespaces."""
    cel = expressions(cfg)
    manifests: list[dict[str, Any]] = []
    for rule in K8S_RULES:
        condition = judged(rule.name)
        manifests += team_policy(
            f"{POLICY_PREFIX}{rule.name}",
            stack,
            resource_rules=[VOLCANO_JOBS],
            variables=[PODS_VARIABLE],
            match_conditions=[condition] if condition is not None else None,
            validations=[
                {
                    "expression": cel[rule.name],
                    "message": f"{rule.description}. Fix: {rule.remediation_for(cfg)}",
                    "reason": "Forbidden",
                }
            ],
            deny=rule.level == "mandatory" and rule.name not in advisory,
            extra_labels={labels.ROLE: "policy"},
        )
    return manifests
