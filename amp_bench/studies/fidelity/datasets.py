"""Real data for the fidelity mode, from datasets scikit-learn ships inside its wheel (nothing is
downloaded): handwritten digits (8x8 images, 10 classes) and breast-cancer diagnostics (30 tabular
features, 2 classes).

The train/test split is stratified and depends only on the split seed, so every precision and
every training seed sees exactly the same held-out examples.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from amp_bench.suite.schema import DATASETS, DEFAULT_MODELS  # noqa: F401 - the names a suite may use

SPLIT_SEED = 0


@dataclass
class Split:
    name: str
    kind: str  # "image" (N, 1, H, W) or "tabular" (N, features)
    num_classes: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str  # where the data came from, for the record

    def to(self, device) -> Split:
        return Split(self.name, self.kind, self.num_classes, self.train_x.to(device), self.train_y.to(device),
                     self.test_x.to(device), self.test_y.to(device), self.source)


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(y):
        index = rng.permutation(np.flatnonzero(y == label))
        n_test = max(1, int(round(len(index) * test_fraction)))
        test.extend(index[:n_test])
        train.extend(index[n_test:])
    return np.sort(np.array(train)), np.sort(np.array(test))


def load(name: str, test_fraction: float = 0.25) -> Split:
    """The named dataset, normalised with statistics of its training part only."""
    import sklearn
    from sklearn import datasets as skd
    if name == "digits":
        bunch = skd.load_digits()
        x = bunch.images.astype(np.float32)[:, None] / 16.0  # pixel values are 0..16
        kind = "image"
    elif name == "breast_cancer":
        bunch = skd.load_breast_cancer()
        x = bunch.data.astype(np.float32)
        kind = "tabular"
    else:
        raise ValueError(f"unknown dataset {name!r} (expected one of {', '.join(DATASETS)})")
    y = bunch.target.astype(np.int64)
    train, test = _stratified_split(y, test_fraction, SPLIT_SEED)
    axes = (0, 2, 3) if kind == "image" else 0
    mean = x[train].mean(axis=axes, keepdims=True)
    std = x[train].std(axis=axes, keepdims=True) + 1e-6
    x = (x - mean) / std
    return Split(name, kind, int(y.max()) + 1, torch.from_numpy(x[train]), torch.from_numpy(y[train]),
                 torch.from_numpy(x[test]), torch.from_numpy(y[test]),
                 f"sklearn.datasets.load_{name} (scikit-learn {sklearn.__version__}, shipped in the package)")
