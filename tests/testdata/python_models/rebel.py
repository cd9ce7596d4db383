"""A stand-in for the RBLN SDK's runtime module (``rebel``), enough for the NPU tutorial's model.py files to run
unchanged on a machine without the NPU: a "compiled model" (``<model>.rbln``) is a JSON file naming the number
of classes, and running it gives ``out[b, k] = mean(x[b]) * (k + 1)``, which the tests recompute."""

import json

import numpy as np


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _logits(x, classes):
    x = np.asarray(x, dtype=np.float32)
    means = x.reshape(x.shape[0], -1).mean(axis=1, keepdims=True)
    return (means * np.arange(1, classes + 1, dtype=np.float32)).astype(np.float32)


class Runtime:
    def __init__(self, path, device=0):
        self.device = device
        self.classes = int(_load(path)["classes"])

    def run(self, x):
        return _logits(x, self.classes)


class _BatchRuntime:
    def __init__(self, classes, batch):
        self.classes = classes
        self.batch = batch

    def __call__(self, x):
        if x.shape[0] != self.batch:
            raise ValueError(f"runtime compiled for batch {self.batch} got batch {x.shape[0]}")
        return _logits(x, self.classes)


class RBLNCompiledModel:
    def __init__(self, path):
        self.classes = int(_load(path)["classes"])

    def create_runtime(self, input_info_index=0):
        return _BatchRuntime(self.classes, input_info_index + 1)
