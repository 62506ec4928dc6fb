"""Upload and listing throughput against the configured object store, side by side in one run.

Upload: the same number of objects sent sequentially (1 thread) and in
parallel (16 threads), each into a fresh bucket.
Listing: the 70,000-object data set listed three ways (recursive as in the
seed, parallel by label prefix, manifest), median of several repeats.

    python benchmarks/bench_upload_listing.py [--upload-size 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import uuid

from common import median_seconds, print_table, write_results

from helpers import listing, storage, upload
from workshop import stack


def bench_upload(client, smoke: int, workers: list[int]) -> list[dict]:
    rows = []
    for threads in workers:
        bucket = f"bench-upload-{uuid.uuid4().hex[:8]}"
        try:
            report = upload.upload_mnist(bucket, smoke, client=client, threads=threads, progress=False)
        finally:
            storage.delete_bucket(client, bucket)
        rows.append({"method": f"{threads} thread{'s' if threads > 1 else ''}",
                     "objects": report.uploaded, "seconds": round(report.seconds, 2),
                     "objects/s": round(report.objects_per_second)})
    for row in rows:
        row["speed-up"] = f"{row['objects/s'] / rows[0]['objects/s']:.1f}x"
    return rows


def bench_listing(client, bucket: str, repeats: int) -> list[dict]:
    print(f"ensuring the 70,000 objects are in '{bucket}' (uploads only on the first run) ...", flush=True)
    upload.upload_mnist(bucket, 0, client=client, progress=False)
    rows = []
    for method in listing.LISTINGS:
        count = len(listing.get_train_test_data(bucket, listing=method, client=client)[0])
        seconds = median_seconds(lambda m=method: listing.get_train_test_data(bucket, listing=m, client=client),
                                 repeats)
        rows.append({"method": method, "train pointers": count, "seconds": round(seconds, 3)})
    for row in rows:
        row["speed-up vs recursive"] = f"{rows[0]['seconds'] / row['seconds']:.1f}x"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upload-size", type=int, default=3000, help="training images per upload run (+1/6 test)")
    parser.add_argument("--listing-bucket", default="bench-listing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    settings = stack.ensure_stack(with_mlflow=False)
    client = storage.get_client(settings, max_connections=32)
    upload = bench_upload(client, args.upload_size, [1, 4, 16])
    print_table("Upload (objects/s)", upload, ["method", "objects", "seconds", "objects/s", "speed-up"])
    listing = bench_listing(client, args.listing_bucket, args.repeats)
    print_table("Listing 70,000 objects", listing,
                ["method", "train pointers", "seconds", "speed-up vs recursive"])
    path = write_results("upload_listing", {
        "object_store": settings.s3_url, "upload": upload, "listing": listing,
        "upload_parallel_vs_sequential": upload[-1]["objects/s"] / upload[0]["objects/s"],
        "listing_best_vs_recursive": listing[0]["seconds"] / min(r["seconds"] for r in listing),
    })
    print(f"\nwritten to {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
