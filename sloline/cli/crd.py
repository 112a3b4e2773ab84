"""`sloline crd`: the PredictionPipeline CRD, or its field reference, from the spec."""

from __future__ import annotations

import argparse

CRD_PATH = "helm/sloline-crds/files/predictionpipelines.sloline.dev.yaml"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "crd",
        help="print the PredictionPipeline CRD generated from the spec",
        description=f"Print the PredictionPipeline CRD generated from the spec models. The "
        f"repository's copy, which the sloline-crds chart installs, is {CRD_PATH}: after a "
        f"spec change, `sloline crd > {CRD_PATH}`.",
    )
    p.add_argument("--reference", action="store_true", help="print the markdown field reference")
    p.set_defaults(func=cmd_crd)


def cmd_crd(args: argparse.Namespace) -> int:
    import yaml

    from sloline.spec.crd import crd_manifest
    from sloline.spec.reference import reference_markdown

    if args.reference:
        print(reference_markdown(), end="")
    else:
        print(yaml.safe_dump(crd_manifest(), sort_keys=False), end="")
    return 0
