"""MNIST in the session's object store for the tests that need it: an uploaded bucket, and images read without Ray."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def uploaded_bucket(client, prefix: str, smoke_test_size: int):
    """A unique bucket holding ``smoke_test_size`` MNIST images, deleted afterwards; Ray stopped too."""
    import uuid

    from helpers import cluster, storage, upload

    name = f"t-{prefix}-{uuid.uuid4().hex[:8]}"
    upload.upload_mnist(name, smoke_test_size, client=client, progress=False)
    try:
        yield name
    finally:
        storage.delete_bucket(client, name)
        cluster.shutdown_ray()


def lakefs_images(repo, ref: str, split: str = "validation", smoke_test_size: int = 0):
    """The ``"validation"`` or ``"test"`` images at a lakeFS ref and their labels, read without Ray.

    Listed in lakeFS, fetched from the bucket: an independent check of what notebook 06 and
    ``helpers.lakefs_experiments`` compute through Ray Data. With ``smoke_test_size``, only the images the
    bucket's manifest names at that size (notebook 02's pointers, not a lakeFS listing).
    """
    import numpy as np

    from helpers import lakefs_experiments, listing, preprocess, storage

    bucket, key_of = lakefs_experiments.commit_pointers(repo, ref, ("test/",) if split == "test" else ("train/",))
    x_train, y_train, x_test, y_test = listing.split_train_test(sorted(key_of))
    paths, labels = (x_test, y_test) if split == "test" else listing.split_validation(x_train, y_train)[1]
    if smoke_test_size:
        named = {key for keys in listing.get_train_test_data(bucket, smoke_test_size, "manifest")[:4:2] for key in keys}
        paths, labels = map(list, zip(*[(p, y) for p, y in zip(paths, labels, strict=True) if key_of[p] in named],
                                      strict=True))
    client = storage.get_client()
    images = preprocess.decode_images([storage.read_object(client, bucket, key_of[p]) for p in paths])
    return images, np.asarray(labels)
