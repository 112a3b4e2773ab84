"""Build the image-ensemble models: three CNNs of clearly different cost, random weights.

    python build.py [--force]

No pretrained weights are downloaded: each network gets fixed-seed random weights, which
is all a serving example needs (its cost, not its accuracy, is what sloline plans for);
one pass over calibration images sets the statistics of its pooled features.
Each takes a normalised float32 (batch, 3, 64, 64) image and ends in a softmax over 10
classes. The small and large networks are saved as TorchScript (models/small.pt,
models/large.pt), the medium one as ONNX with a dynamic batch axis (models/medium.onnx;
the exporter needs the `onnxscript` package). Existing files are kept unless --force.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ensemble_stages import IMAGE_SIZE, preprocess, samples  # noqa: E402 - needs HERE on sys.path

CLASSES = 10
CALIBRATION_IMAGES = 64
CALIBRATION_SEED = 1234  # not the seed of the sample requests


@dataclass(frozen=True)
class Architecture:
    widths: tuple[int, ...]  # output channels of each 3x3 convolution
    strides: tuple[int, ...]
    seed: int
    file: str  # .pt -> TorchScript, .onnx -> ONNX


# Roughly 1 ms, 4 ms and 15 ms per image at batch 1 on one CPU thread (see README.md).
ARCHITECTURES = {
    "small": Architecture((32, 48, 64, 64), (2, 1, 2, 2), seed=1, file="small.pt"),
    "medium": Architecture(
        (64, 96, 96, 128, 128, 192, 192), (2, 1, 1, 2, 1, 2, 1), seed=2, file="medium.onnx"
    ),
    "large": Architecture(
        (64, 128, 128, 128, 192, 192, 256, 256), (2, 1, 1, 1, 2, 1, 2, 1), seed=3, file="large.pt"
    ),
}


class ConvNet(nn.Module):
    """3x3 convolutions with ReLU, global average pooling, a linear head, softmax."""

    def __init__(self, architecture: Architecture) -> None:
        super().__init__()
        torch.manual_seed(architecture.seed)
        layers: list[nn.Module] = []
        channels = 3
        for width, stride in zip(architecture.widths, architecture.strides, strict=True):
            conv = nn.Conv2d(channels, width, 3, stride=stride, padding=1)
            # He initialisation keeps activations at a constant scale through the depth;
            # torch's default shrinks them layer by layer until every image looks alike.
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*layers)
        # Pooled features are standardised with statistics of calibration images
        # (`calibrate`), and the head's weights are drawn so that logits have a standard
        # deviation near 2: random members then disagree and are confident to different
        # degrees per image, as trained ensemble members are.
        self.norm = nn.BatchNorm1d(channels, affine=False, momentum=None)
        self.head = nn.Linear(channels, CLASSES)
        nn.init.normal_(self.head.weight, std=2.0 / math.sqrt(channels))
        nn.init.zeros_(self.head.bias)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        pooled = self.features(image).mean(dim=(2, 3))
        return torch.softmax(self.head(self.norm(pooled)), dim=1)


def calibrate(model: ConvNet, images: torch.Tensor) -> ConvNet:
    """Set the feature statistics from `images` (one pass in training mode), then freeze."""
    model.train()
    with torch.no_grad():
        model(images)
    return model.eval()


def calibration_images() -> torch.Tensor:
    raw = samples(count=CALIBRATION_IMAGES, seed=CALIBRATION_SEED)
    return torch.from_numpy(preprocess(raw)["image"])


def save_torchscript(model: nn.Module, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is marked deprecated
        scripted = torch.jit.script(model)
    partial = path.with_suffix(".partial")
    scripted.save(str(partial))
    os.replace(partial, path)


def save_onnx(model: nn.Module, path: Path) -> None:
    # Batch 2 in the example input: torch.export specialises a dimension of size 1.
    example = torch.zeros(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    partial = path.with_suffix(".partial")
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the exporter logs every optional op it skips
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # raised inside torch.export
            torch.onnx.export(
                model,
                (example,),
                str(partial),
                input_names=["image"],
                output_names=["probabilities"],
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                external_data=False,
                verbose=False,
            )
    finally:
        quiet.setLevel(level)
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild and overwrite")
    args = parser.parse_args(argv)

    models = HERE / "models"
    models.mkdir(exist_ok=True)
    images = calibration_images()
    for name, architecture in ARCHITECTURES.items():
        path = models / architecture.file
        if path.is_file() and not args.force:
            print(f"{name:7s} present: {path} (use --force to rebuild)")
            continue
        model = calibrate(ConvNet(architecture), images)
        if path.suffix == ".onnx":
            save_onnx(model, path)
        else:
            save_torchscript(model, path)
        print(f"{name:7s} wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
