"""The models: the seed's MLP and a small CNN, both ending in log-softmax for NLLLoss (notebooks 04-06)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from helpers.config import ParameterError

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


class MNISTModel(nn.Module):
    """The seed's multilayer perceptron: 784 -> hidden layers -> 10, log-probabilities out.

    Args:
        input_size: pixels per image (28 * 28).
        hidden_sizes: width of each hidden layer.
        output_size: number of classes.
        dropout: dropout rate after each hidden layer (notebook 05 tunes it).
        activation: ``"relu"`` or ``"tanh"``.
    """

    def __init__(self, input_size: int = 784, hidden_sizes: Sequence[int] = (128, 64), output_size: int = 10,
                 dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ParameterError(f"activation must be one of {sorted(ACTIVATIONS)}, not {activation!r}.")
        if not 0.0 <= dropout < 1.0:
            raise ParameterError(f"dropout must be in [0, 1), not {dropout}.")
        layers: list[nn.Module] = [nn.Flatten()]
        width = input_size
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, int(hidden)), ACTIVATIONS[activation]()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = int(hidden)
        layers += [nn.Linear(width, output_size), nn.LogSoftmax(dim=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[batch, 10]`` for images ``[batch, 1, 28, 28]`` (or flat ``[batch, 784]``)."""
        return self.net(x)


class MNISTConvNet(nn.Module):
    """A small CNN (two conv blocks), about 99% test accuracy on full MNIST."""

    def __init__(self, channels: Sequence[int] = (16, 32), hidden: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        c1, c2 = channels
        self.net = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, 10), nn.LogSoftmax(dim=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[batch, 10]`` for images ``[batch, 1, 28, 28]``."""
        return self.net(x.reshape(-1, 1, 28, 28))


def build_model(model: str = "mlp", hidden_sizes: Sequence[int] = (128, 64), dropout: float = 0.0,
                activation: str = "relu") -> nn.Module:
    """A fresh model by name: ``"mlp"`` (:class:`MNISTModel`) or ``"cnn"`` (:class:`MNISTConvNet`)."""
    if model == "mlp":
        return MNISTModel(784, hidden_sizes, 10, dropout=dropout, activation=activation)
    if model == "cnn":
        return MNISTConvNet(dropout=dropout)
    raise ParameterError(f"model must be 'mlp' or 'cnn', not {model!r}.")


@torch.no_grad()
def predict(model: nn.Module, images: np.ndarray | torch.Tensor, batch_size: int = 2000) -> np.ndarray:
    """Predicted class of every image, in vectorised batches (no per-image loop)."""
    model.eval()
    x = torch.as_tensor(np.asarray(images, dtype=np.float32))
    out = [model(x[i:i + batch_size]).argmax(dim=1) for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of predictions equal to the labels."""
    labels = np.asarray(labels)
    return float((np.asarray(predictions) == labels).mean()) if len(labels) else 0.0


def confusion_matrix(predictions: np.ndarray, labels: np.ndarray, classes: int = 10) -> np.ndarray:
    """``[true, predicted]`` counts."""
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)), 1)
    return matrix
