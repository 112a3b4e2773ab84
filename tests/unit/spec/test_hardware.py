"""The hardware catalog's `devices`: validated, unbounded where unset (the default CPU
catalog, Kubernetes classes), one device for a `--catalog` class with a CUDA device, and a
clear one-line error where a CUDA class claims more."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sloline.cli import main
from sloline.spec import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    HardwareClass,
    PipelineError,
    load_catalog,
)
from tests.support.serve import NOOP


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return path


def test_devices_is_optional_and_at_least_one() -> None:
    assert HardwareClass(name="gpu", cost_per_hour=1.0).devices is None
    assert HardwareClass.model_validate({"name": "g", "costPerHour": 1, "devices": 4}).devices == 4
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        HardwareClass.model_validate({"name": "g", "costPerHour": 1, "devices": 0})
    assert all(hw.devices is None for hw in DEFAULT_CATALOG.classes)


def test_a_model_validated_cuda_class_stays_unbounded() -> None:
    """The Kubernetes path (operator settings): a pod per replica, so no default bound
    even where the class names the CUDA device its pods use."""
    catalog = HardwareCatalog.model_validate(
        {"classes": [{"name": "gpu", "costPerHour": 1, "embedded": {"cudaDevice": 0}}]}
    )
    assert catalog.get("gpu").devices is None


def test_a_catalog_file_makes_a_cuda_class_one_device(tmp_path: Path) -> None:
    catalog = load_catalog(
        write(
            tmp_path,
            "classes:\n"
            "  - {name: cpu-1, costPerHour: 0.05}\n"
            "  - {name: cpu-8, costPerHour: 0.4, devices: 2}\n"
            "  - {name: gpu-0, costPerHour: 2.5, embedded: {cudaDevice: 0}}\n"
            "  - {name: gpu-1, costPerHour: 2.5, devices: 1, embedded: {cudaDevice: 1}}\n",
        )
    )
    assert [hw.devices for hw in catalog.classes] == [None, 2, 1, 1]


def test_a_cuda_class_with_more_devices_is_rejected_naming_the_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "classes:\n"
        "  - {name: cpu-1, costPerHour: 0.05}\n"
        "  - {name: gpu-0, costPerHour: 2.5, devices: 2, embedded: {cudaDevice: 0}}\n",
    )
    with pytest.raises(PipelineError) as info:
        load_catalog(path)
    (issue,) = info.value.issues
    assert issue.path == "classes.1.devices"
    assert "embedded.cudaDevice 0, one device: devices must be 1 or unset, got 2" in str(issue)


def test_sloline_plan_reports_a_bad_devices_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "classes:\n  - {name: gpu-0, costPerHour: 2.5, devices: 3, embedded: {cudaDevice: 0}}\n",
    )
    assert main(["plan", str(NOOP), "--catalog", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "classes.0.devices" in err and "devices must be 1 or unset, got 3" in err
    assert err.count("classes.0.devices") == 1
