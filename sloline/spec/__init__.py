"""The PredictionPipeline spec: models, validation, conditions, hardware catalog, CRD."""

from sloline.spec.condition import Condition, ConditionError, parse_condition
from sloline.spec.hardware import DEFAULT_CATALOG, HardwareCatalog, HardwareClass, load_catalog
from sloline.spec.loader import LoadedPipeline, load_pipeline, parse_pipeline
from sloline.spec.models import (
    API_VERSION,
    KIND,
    ModelSpec,
    PipelineSpec,
    PredictionPipeline,
    StageSpec,
    TensorSpec,
)
from sloline.spec.validate import Issue, PipelineError, PipelineGraph, Ref, StageNode, build_graph

__all__ = [
    "API_VERSION",
    "DEFAULT_CATALOG",
    "KIND",
    "Condition",
    "ConditionError",
    "HardwareCatalog",
    "HardwareClass",
    "Issue",
    "LoadedPipeline",
    "ModelSpec",
    "PipelineError",
    "PipelineGraph",
    "PipelineSpec",
    "PredictionPipeline",
    "Ref",
    "StageNode",
    "StageSpec",
    "TensorSpec",
    "build_graph",
    "load_catalog",
    "load_pipeline",
    "parse_condition",
    "parse_pipeline",
]
