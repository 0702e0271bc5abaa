"""A job's `cacheFrom` must be inside a source the node cache agent fetches from: component by
component, on a normalised path (the agent refuses the rest; docs/prewarm.md, "Which
sources"), so the job is refused when it renders instead of pending on a refused publish."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.jobs.test_render import cache_job, issues_of
from trainstack import outputs as out
from trainstack.builders.cache import source_under
from trainstack.jobs.platform import PlatformView
from trainstack.preview.plan import Plan

SETS = "/fsx/datasets/"


def _with_source(plan: Plan, source: str) -> PlatformView:
    """The platform with a directory source as well (storage.nvmeCache.sources)."""
    outputs = dict(plan.outputs)
    storage = dict(outputs[out.STORAGE])
    storage["cache"] = {**storage["cache"], "sources": [*storage["cache"]["sources"], source]}
    outputs[out.STORAGE] = storage
    return PlatformView(outputs)


@pytest.fixture
def dev_with_dir_source(example_plans: dict[str, Plan]) -> PlatformView:
    return _with_source(example_plans["dev"], SETS)


@pytest.mark.parametrize(
    "cache_from", [f"{SETS}imagenet/v1/", f"{SETS}imagenet/v1", "s3://acme-datasets/imagenet/v1/"]
)
def test_a_source_inside_an_allowed_one_is_accepted(
    dev_with_dir_source: PlatformView, cache_from: str
) -> None:
    assert issues_of(cache_job(cache_from), dev_with_dir_source) == []


@pytest.mark.parametrize(
    "cache_from",
    [
        "/fsx/datasets/../../etc/",  # starts with the allowed prefix, resolves outside it
        "/fsx/datasets/imagenet/../../secrets/v1/",
        "/fsx/datasets/./imagenet/v1/",
        "/fsx/datasets//imagenet/v1/",
    ],
)
def test_a_path_that_is_not_normalised_is_refused_naming_the_fix(
    dev_with_dir_source: PlatformView, cache_from: str
) -> None:
    assert issues_of(cache_job(cache_from), dev_with_dir_source) == [
        f"job.spec.data.cacheFrom: {cache_from!r} is not a normalised absolute path (the cache "
        "agent refuses '.', '..' and empty segments); write the dataset version's directory "
        "itself, such as /fsx/datasets/imagenet/v1/"
    ]


@pytest.mark.parametrize("allowed", [SETS, SETS.rstrip("/")])
def test_a_sibling_that_shares_the_prefixs_characters_is_not_under_it(
    example_plans: dict[str, Plan], allowed: str
) -> None:
    """Whether or not the platform's source ends in `/` (the schema now requires it; an
    older platform stack's outputs may lack it)."""
    view = _with_source(example_plans["dev"], allowed)
    assert issues_of(cache_job("/fsx/datasetsX/imagenet/v1/"), view) == [
        "job.spec.data.cacheFrom: '/fsx/datasetsX/imagenet/v1/' is not under a source the node "
        f"cache fetches from (s3://acme-datasets/, {allowed}); the platform adds one in "
        "storage.nvmeCache.sources"
    ]


_SEGMENTS = st.sampled_from(["data", "sets", "setsX", "se", "..", ".", "", "a.b", "..x"])
_PATHS = st.builds(
    lambda parts, slash: "/" + "/".join(parts) + ("/" if slash else ""),
    st.lists(_SEGMENTS, max_size=5),
    st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(source=st.one_of(_PATHS, st.just("s3://acme-datasets/x/")), prefix=_PATHS)
def test_the_job_layer_and_the_agent_agree_on_what_is_under_a_source(
    source: str, prefix: str
) -> None:
    """The two layers are separate packages (the agent's image has no trainstack): the same
    verdict on every pair, or a job would render and then pend on a refused publish."""
    from trainstack_prewarm import sources  # noqa: PLC0415 (the image's package)

    assert source_under(source, prefix) == sources.source_under(source, prefix)
    if source_under(source, prefix):  # and inside it once resolved, component by component
        resolved, root = posixpath.normpath(source), posixpath.normpath(prefix)
        assert resolved == root or resolved.startswith(root + "/")


def test_a_cached_job_on_a_pool_without_the_cache_is_refused(
    example_plans: dict[str, Plan],
) -> None:
    """Issue 39 #9: the cache agent runs only on pools with an instance-store array; a cached
    job on another pool would wait forever for a publish no agent answers."""
    outputs = dict(example_plans["dev"].outputs)
    pools = [dict(p) for p in outputs[out.GPU_POOLS]]
    assert [p["datasetCache"] for p in pools] == [True]
    pools[0]["datasetCache"] = False
    outputs[out.GPU_POOLS] = pools
    view = PlatformView(outputs)
    pool = pools[0]["name"]
    assert issues_of(cache_job("s3://acme-datasets/imagenet/v1/"), view) == [
        f"job.spec.data.source: pool {pool} has no dataset cache (no instance-store array on "
        "its nodes); use source: lustre, or a pool with one: none"
    ]
