#!/usr/bin/env python3
"""Regenerates tests/golden/metrics.json: the task metrics and losses the C++ tests compare against.

Metrics from scikit-learn (Debian python3-sklearn), losses from PyTorch (python3-torch). Run from
the repository root:
    .venv/bin/python tests/golden/make_metrics_golden.py
The arrays are seeded and stored in the file, so the test reads inputs and expected values together.
"""
import json

import numpy as np
import sklearn
import torch
from sklearn import metrics as skm

rng = np.random.default_rng(16)
out = {"sklearn_version": sklearn.__version__, "torch_version": torch.__version__}

# Classification: 53 samples (not a multiple of the test's batch of 8), 6 classes.
n, c = 53, 6
logits = rng.normal(size=(n, c)).round(3)
y = rng.integers(0, c, size=n)
out["classification"] = {
    "logits": logits.tolist(), "labels": y.tolist(),
    "accuracy": float(skm.accuracy_score(y, logits.argmax(1))),
    "top3_accuracy": float(skm.top_k_accuracy_score(y, logits, k=3, labels=list(range(c)))),
    "loss": float(torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(y))),
}

# Regression: 41 samples, targets [41, 2, 2] (outputs flattened per sample).
n = 41
target = rng.normal(loc=3.0, scale=2.0, size=(n, 2, 2))
pred = target + rng.normal(scale=0.7, size=target.shape)
target[:, 1, 1] = target[:, 1, 1] * 10 + 50  # outputs on different scales: averages are per output
pred[:, 1, 1] = target[:, 1, 1] + rng.normal(scale=5.0, size=n)
t2, p2 = target.reshape(n, -1), pred.reshape(n, -1)
out["regression"] = {
    "pred": pred.tolist(), "target": target.tolist(),
    "mae": float(skm.mean_absolute_error(t2, p2)),
    "rmse": float(np.mean(np.sqrt(skm.mean_squared_error(t2, p2, multioutput="raw_values")))),
    "r2": float(skm.r2_score(t2, p2)),
    "mse_loss": float(torch.nn.functional.mse_loss(torch.tensor(pred), torch.tensor(target))),
    "l1_loss": float(torch.nn.functional.l1_loss(torch.tensor(pred), torch.tensor(target))),
    "huber_loss_delta_2": float(torch.nn.functional.huber_loss(torch.tensor(pred), torch.tensor(target), delta=2.0)),
}
# R^2 of a constant target predicted exactly (1) and not exactly (0), as sklearn's force_finite.
const = np.full((5, 1), 2.5)
out["regression_constant"] = {
    "exact": float(skm.r2_score(const, const)),
    "off": float(skm.r2_score(const, const + np.arange(5).reshape(5, 1) * 0.1)),
}

# Multi-label: 67 samples, 5 classes; scores rounded to one decimal so many tie.
n, c = 67, 5
labels = (rng.random(size=(n, c)) < np.array([0.1, 0.3, 0.5, 0.7, 0.05])).astype(np.float64)
scores = (labels * 0.8 + rng.normal(scale=0.9, size=(n, c))).round(1)
pos_weight = [1.0, 2.0, 0.5, 1.5, 3.0]
probs = 1 / (1 + np.exp(-scores))
pred = (probs >= 0.5).astype(int)
out["multilabel"] = {
    "logits": scores.tolist(), "labels": labels.tolist(), "pos_weight": pos_weight,
    "roc_auc_per_class": [float(skm.roc_auc_score(labels[:, k], scores[:, k])) for k in range(c)],
    "roc_auc_macro": float(skm.roc_auc_score(labels, scores, average="macro")),
    "f1_micro": float(skm.f1_score(labels, pred, average="micro", zero_division=0)),
    "f1_macro": float(skm.f1_score(labels, pred, average="macro", zero_division=0)),
    "bce_loss": float(torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor(scores), torch.tensor(labels), pos_weight=torch.tensor(pos_weight))),
}
# A class never predicted and never present scores F1 0 (zero_division=0), a tie-only class 0.5 AUC.
out["multilabel_edge"] = {
    "pred": [[1, 0], [0, 0], [1, 0]], "labels": [[1, 0], [0, 0], [0, 0]],
    "f1_micro": float(skm.f1_score([[1, 0], [0, 0], [0, 0]], [[1, 0], [0, 0], [1, 0]], average="micro", zero_division=0)),
    "f1_macro": float(skm.f1_score([[1, 0], [0, 0], [0, 0]], [[1, 0], [0, 0], [1, 0]], average="macro", zero_division=0)),
    "auc_all_tied": float(skm.roc_auc_score([0, 1, 0, 1], [0.3, 0.3, 0.3, 0.3])),
}

# Language model: [3, 7] windows over a vocabulary of 11, two positions ignored (-100).
b, t, v = 3, 7, 11
lm_logits = rng.normal(size=(b, t, v)).round(3)
lm_targets = rng.integers(0, v, size=(b, t))
lm_targets[0, 2] = -100
lm_targets[2, 6] = -100
loss = float(torch.nn.functional.cross_entropy(torch.tensor(lm_logits).reshape(-1, v),
                                               torch.tensor(lm_targets).reshape(-1), ignore_index=-100))
valid = lm_targets.reshape(-1) != -100
out["language_model"] = {
    "logits": lm_logits.tolist(), "targets": lm_targets.tolist(),
    "loss": loss, "perplexity": float(np.exp(loss)), "bits_per_token": loss / float(np.log(2)),
    "accuracy": float((lm_logits.reshape(-1, v).argmax(1) == lm_targets.reshape(-1))[valid].mean()),
}

with open("tests/golden/metrics.json", "w") as f:
    json.dump(out, f, indent=1)
print("wrote tests/golden/metrics.json")
