"""One reconcile against the Kubernetes API emulator (tests/support/kube): with every
profile cached, it plans and deploys, decoding each profile message once and computing
the dataflow digest once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from sloline.operator import planning
from sloline.operator import reconcile as reconcile_module
from sloline.operator.kube import KubeApi
from sloline.operator.naming import Target, profiles_name
from sloline.operator.planning import CacheEntry, dataflow_digest, profile_tasks
from sloline.operator.reconcile import OperatorContext, reconcile
from sloline.operator.settings import OperatorSettings
from sloline.planner import profile_message
from sloline.planner.profile import StageProfile
from sloline.planner.profile_message import ProfileMessage, encode_profile
from tests.support.kube import KubeEmulator
from tests.unit.operator.helpers import NOOP

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "helm" / "sloline" / "crds" / "predictionpipelines.sloline.dev.yaml"


def test_a_reconcile_decodes_each_profile_message_once(
    kube: KubeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.register_crd(CRD)
    body = kube.create(yaml.safe_load(NOOP.read_text()) | {"metadata": {"name": "noop"}})
    settings = OperatorSettings()
    target = Target.of(body)
    dataflow = dataflow_digest(target, settings)
    messages = {
        task.key: encode_profile(
            task.stage, task.hardware, StageProfile.from_latencies(task.hardware, {1: 1e-3})
        )
        for task in profile_tasks(target, settings)
    }
    cache = {key: CacheEntry.of(text, dataflow).to_text() for key, text in messages.items()}
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": profiles_name("noop"), "namespace": "default"},
            "data": cache,
        }
    )

    decoded: Counter[str] = Counter()
    digests: list[str] = []
    real_decode, real_digest = profile_message.decode_message, dataflow_digest

    def counting_decode(text: str) -> ProfileMessage:
        decoded[text] += 1
        return real_decode(text)

    def counting_digest(t: Target, s: OperatorSettings) -> str:
        digests.append(real_digest(t, s))
        return digests[-1]

    for module in (profile_message, planning, reconcile_module):
        if hasattr(module, "decode_message"):
            monkeypatch.setattr(module, "decode_message", counting_decode)
    monkeypatch.setattr(reconcile_module, "dataflow_digest", counting_digest)

    ctx = OperatorContext(KubeApi.connect(str(kube.kubeconfig_path)), settings)
    report = reconcile(ctx, body, lambda _type, _reason, _message: None)

    assert report.created  # planned and deployed
    assert decoded == Counter(messages.values())  # each message once
    assert digests == [dataflow]
