"""What a kubelet and the Job controller would do for the operator's profiling Jobs, in
tests against the Kubernetes emulator (which runs no pods): run the Job's command for
real — `profile_job`, the body of `sloline profile-job`, on the pipeline file the Job
mounts — then create the Job's pod with the result as its container's termination
message and mark the Job complete.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from sloline.measure.profiler import ProfilerSettings, profile_job
from sloline.planner.profile_message import encode_message
from sloline.spec import load_catalog, load_pipeline

# Small enough for a test, real enough to plan with: batch sizes 1..4, 3 timed runs each.
QUICK = ProfilerSettings(max_batch_cap=4, repeats=3, budget_s=0.05)


@functools.cache
def profile_message(
    pipeline_yaml: str, catalog_yaml: str, stage: str, hardware: str, model_dir: str
) -> str:
    """`sloline profile-job` on these files, in this process; the encoded message."""
    with tempfile.TemporaryDirectory(prefix="kubelet-") as tmp:
        pipeline_file = Path(tmp) / "pipeline.yaml"
        pipeline_file.write_text(pipeline_yaml)
        catalog_file = Path(tmp) / "catalog.yaml"
        catalog_file.write_text(catalog_yaml)
        loaded = load_pipeline(pipeline_file, model_dir=model_dir)
        hw = load_catalog(catalog_file).get(hardware)
        return encode_message(profile_job(loaded, stage, hw, QUICK, hop_requests=0))


def job_pod(job: dict[str, Any]) -> dict[str, Any]:
    """The pod the Job controller would create: the template, the job-name label, the
    Job as its controller."""
    meta, template = job["metadata"], job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{meta['uid'][:5]}",
            "namespace": meta["namespace"],
            "labels": {**template["metadata"]["labels"], "job-name": meta["name"]},
            "annotations": dict(template["metadata"].get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }


def finish_job(kube: Any, job: dict[str, Any], message: str, *, exit_code: int = 0) -> None:
    """Create the Job's pod, terminated with `message`, and mark the Job done."""
    pod = job_pod(job)
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    kube.create(pod)
    terminated = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "message": message,
    }
    container = {
        "name": "profiler",
        "ready": False,
        "restartCount": 0,
        "image": pod["spec"]["containers"][0]["image"],
        "imageID": "",
        "state": {"terminated": terminated},
    }
    phase = "Succeeded" if exit_code == 0 else "Failed"
    status = {"phase": phase, "containerStatuses": [container]}
    kube.patch("pods", namespace, name, {"status": status}, subresource="status")
    done = "Complete" if exit_code == 0 else "Failed"
    job_status = {
        "succeeded": 1 if exit_code == 0 else 0,
        "failed": 0 if exit_code == 0 else 2,
        "conditions": [{"type": done, "status": "True"}],
    }
    kube.patch(
        "jobs", namespace, job["metadata"]["name"], {"status": job_status}, subresource="status"
    )


def run_job(kube: Any, job: dict[str, Any], model_dir: Path) -> str:
    """Run a profiling Job as a node would: its pipeline and catalog files come from the
    ConfigMap it mounts, its stage and class from its arguments."""
    namespace = job["metadata"]["namespace"]
    volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    files = kube.get("configmaps", namespace, volume["configMap"]["name"])["data"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    message = profile_message(
        files["pipeline.yaml"],
        files["catalog.yaml"],
        flags["--stage"],
        flags["--hardware"],
        str(model_dir),
    )
    finish_job(kube, job, message)
    return message
