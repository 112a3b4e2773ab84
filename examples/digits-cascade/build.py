"""Train the digits-cascade models and export them to ONNX (models/fast.onnx, accurate.onnx).

    python build.py [--force]

Both models are trained on the fixed train split of scikit-learn's bundled digits data
(`digits_stages.split`), on the features the pipeline's `preprocess` stage produces:
- fast: multinomial logistic regression (one 64x10 matrix product);
- accurate: an RBF-kernel SVM with sigmoid-calibrated probabilities (hundreds of support
  vectors per request: clearly more accurate, and clearly more work).

Existing model files are kept unless --force is given. Either way the script reports the
test accuracy of both ONNX files (as onnxruntime runs them) and what the cascade's
condition in pipeline.yaml does on the test split.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType
from sklearn.calibration import CalibratedClassifierCV
from sklearn.linear_model import LogisticRegression
from sklearn.svm import SVC

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from digits_stages import scale, split  # noqa: E402 - needs HERE on sys.path

from sloline.spec import load_pipeline  # noqa: E402 - grouped with the local import above

FEATURES = 64
OPSET = 17  # old enough for every onnxruntime sloline supports


def train_models(features: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    fast = LogisticRegression(max_iter=1000).fit(features, labels)
    accurate = CalibratedClassifierCV(SVC(C=10.0, gamma="scale"), ensemble=False)
    accurate.fit(features, labels)
    return {"fast": fast, "accurate": accurate}


def export(model: Any, path: Path) -> None:
    with warnings.catch_warnings():
        # skl2onnx's SVC converter reads SVC attributes scikit-learn has deprecated.
        warnings.simplefilter("ignore", FutureWarning)
        onx = to_onnx(
            model,
            initial_types=[("features", FloatTensorType([None, FEATURES]))],
            options={"zipmap": False},  # a plain probability tensor, not a list of maps
            target_opset=OPSET,
        )
    partial = path.with_suffix(".partial")
    partial.write_bytes(onx.SerializeToString())
    os.replace(partial, path)  # never leave a half-written model behind


def probabilities(path: Path, features: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (result,) = session.run(["probabilities"], {"features": features})
    return np.asarray(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="retrain and overwrite")
    args = parser.parse_args(argv)

    models = HERE / "models"
    paths = {name: models / f"{name}.onnx" for name in ("fast", "accurate")}
    x_train, x_test, y_train, y_test = split()
    if args.force or not all(p.is_file() for p in paths.values()):
        models.mkdir(exist_ok=True)
        for name, model in train_models(scale(x_train), y_train).items():
            export(model, paths[name])
            print(f"wrote {paths[name]}")
    else:
        print(f"models present in {models} (use --force to rebuild)")

    features = scale(x_test)
    fast = probabilities(paths["fast"], features)
    accurate = probabilities(paths["accurate"], features)
    print(f"fast      test accuracy {np.mean(fast.argmax(1) == y_test):.4f}")
    print(f"accurate  test accuracy {np.mean(accurate.argmax(1) == y_test):.4f}")

    condition = load_pipeline(HERE / "pipeline.yaml").graph.stages["accurate"].condition
    assert condition is not None
    escalated = np.array([condition({"fast": {"probabilities": p}}) for p in fast])
    answer = np.where(escalated, accurate.argmax(1), fast.argmax(1))
    print(
        f"cascade   test accuracy {np.mean(answer == y_test):.4f}; "
        f"{escalated.mean():.1%} of {len(y_test)} test requests reach 'accurate' "
        f"({condition.text})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
