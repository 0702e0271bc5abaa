"""Issue 43: what keeps an elastic job's rendezvous pod off Volcano's reclaim victim list.

The control-plane scenario (test_guarantees.py) shows a lender getting its guarantee from an
elastic job's workers only, but which node reclaim picks is random, so it cannot show that
the store would have gone without its exemption. Here Volcano's own reclaim action, at the
pinned version (`elasticprobe`, built with the scheduler: tools/volcano/elasticprobe), runs
the one scenario where the store is the only candidate: alone on the only node the lender's
pod fits, its job above its minimum, under the platform's generated scheduler configuration
in both queue modes. With the labels and annotations the job layer renders on the store's
template nothing is evicted; with none of them, the store is (gang.go permits `ready -
minMember` pods of any role, and nothing else stands in the way).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from trainstack.builders.scheduling import scheduler_config
from trainstack.config import PlatformConfig
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import RENDEZVOUS, render
from trainstack.jobs.spec import load_job
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan

ELASTIC = ROOT / "job_specs" / "vision" / "elastic-pretrain.yaml"
STORE = "c1/e-rendezvous-0"


def _probe(tool: Path, conf: dict[str, Any], meta: dict[str, Any], evicted: list[str]) -> None:
    payload = {
        "conf": yaml.safe_dump(conf, sort_keys=False),
        "storeLabels": meta.get("labels", {}),
        "storeAnnotations": meta.get("annotations", {}),
        "expectEvicted": evicted,
    }
    run = subprocess.run(
        [str(tool)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # Volcano's fake evictor prints the pods it evicts on stdout too: the verdict is last.
    verdict = json.loads(run.stdout.strip().splitlines()[-1])
    assert verdict["ok"], f"expected evictions {evicted}: {verdict['error']}"


@pytest.mark.parametrize("mode", ["hierarchical", "flat"])
def test_reclaim_never_takes_the_rendered_rendezvous_pod(
    tools: dict[str, Path],
    previewer: Previewer,
    example_plans: dict[str, Plan],
    mode: str,
) -> None:
    cfg, _ = previewer.load("prod")
    assert isinstance(cfg, PlatformConfig)
    cfg = dataclasses.replace(cfg, scheduling=dataclasses.replace(cfg.scheduling, queue_mode=mode))
    conf = scheduler_config(cfg)
    manifest = render(load_job(ELASTIC), PlatformView(example_plans["prod"].outputs), "vision")
    (store,) = (t for t in manifest["spec"]["tasks"] if t["name"] == RENDEZVOUS)
    _probe(tools["elasticprobe"], conf, store["template"]["metadata"], [])
    # The control: the same pod without what the job layer renders on it.
    _probe(tools["elasticprobe"], conf, {}, [STORE])
