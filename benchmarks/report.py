"""The measured numbers the README and the notebooks state, written from ``benchmarks/results/*.json``.

A time or an accuracy stated in more than one place drifts apart when it is copied by hand. This
script writes them all from the measurements: the README's notebook table (smoke-size and full-size
time of each notebook) and its line on notebook 04's full-size accuracy, each notebook's **Time**
row in its "Before you start" table, and the whole of ``docs/results.md``: every benchmark's tables and
the prose around them, each number in it read or computed from the JSON. ``--check`` writes nothing
and exits 1 where a file differs from what the JSON says (the tests run it).

    python benchmarks/report.py          # rewrite what differs
    python benchmarks/report.py --check  # say what differs, exit 1 if anything does
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results.md"
TABLE = ("<!-- notebook-times:start -->", "<!-- notebook-times:end -->")
ACCURACY = ("<!-- full-size-accuracy:start -->", "<!-- full-size-accuracy:end -->")
SERVING = ("<!-- serving:start -->", "<!-- serving:end -->")

# notebook -> (link text, what it teaches, in one line)
NOTEBOOKS = {
    "01": ("upload MNIST", "a `Minio` client and `put_object`; a parallel (`threads`), idempotent, resumable upload "
                           "with a manifest and a repair by size and ETag"),
    "02": ("list and split", "the recursive `list_objects` and `split('/')` into pointer lists; parallel and "
                             "manifest listings compared"),
    "03": ("Ray Data preprocessing", "`map_batches` with tasks and with actors, `materialize()`, "
                                     "`iter_torch_batches`; `read_images` and packed Parquet shards compared"),
    "04": ("distributed training", "a Ray Train loop with `TorchTrainer`, checkpoints in the bucket and resume "
                                   "after a failure, tracked in MLflow; the model logged and served"),
    "05": ("Ray Tune sweeps", "`HyperOptSearch` from notebook 04's defaults, `ASHAScheduler`, every trial an MLflow "
                              "child run"),
    "06": ("parallel experiments on lakeFS", "a zero-copy import, one branch per experiment run in parallel, commit, "
                                             "diff, merge and tag; the champion in the MLflow registry; reproduce "
                                             "from a commit id"),
    "07": ("batch inference", "the `@champion` model over the test set with Ray Data and a pool of model actors; "
                              "Parquet written, read back and questioned; the driver beside it"),
    "08": ("serve the champion", "a Ray Serve deployment of the `@champion` version with `@serve.batch`, answers "
                                 "with their lineage, a roll to another version under load (a rule, a canary, the "
                                 "whole) with zero errors"),
}
# notebook -> what its smoke-size and full-size runs do, for its Time row
SIZES = {
    "01": ("600 training images, 3,600 objects", "70,000 images"),
    "02": ("3,600 keys", "70,000 keys"),
    "03": ("600 training images", "50,000 training images"),
    "04": ("600 training images, 10 epochs", "50,000 training images, 10 epochs"),
    "05": ("600 training images, 8 trials of up to 10 epochs", "50,000 training images"),
    "06": ("3,600 objects, 4 experiments", "70,000 objects, 4 experiments over 50,000 training images each"),
    "07": ("2,000 test images", "10,000 test images"),
    "08": ("500 test images sent", "500 test images sent"),
}


def duration(seconds: float | None) -> str:
    """``42 s`` under 100 seconds, else ``2.1 min``; ``—`` where nothing was measured."""
    if seconds is None:
        return "—"
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def load(name: str) -> dict:
    """A results file, or {} where ``make bench`` has not written it."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def measured() -> dict[str, dict]:
    """Per notebook: smoke-size seconds (the smoke benchmark's "after" run on the stack's Ray) and full-size seconds.

    A notebook the "after" run did not include takes its time from the run labelled ``after-<number>``
    (``bench_smoke.py --only 08 --label after-08``), measured on its own.
    """
    runs = load("smoke").get("runs", {})
    smoke = {row["notebook"]: row for row in runs.get("after", {}).get("notebooks", [])}
    for number in NOTEBOOKS:
        if number not in smoke:
            smoke.update({row["notebook"]: row for row in runs.get(f"after-{number}", {}).get("notebooks", [])
                          if row["notebook"] == number})
    full = {row["notebook"]: row for row in load("full_size").get("rows", [])}
    out = {}
    for number in NOTEBOOKS:
        fast, slow = smoke.get(number, {}), full.get(number, {})
        out[number] = {"smoke": fast.get("seconds") if fast.get("status") == ["ok"] else None,
                       "full": slow.get("seconds") if slow.get("status") == "ok" else None}
    return out


def lakefs_note(name: str) -> str:
    """``, against the lakeFS API double`` where notebook 06 ran against it in ``name``'s run, else nothing."""
    said = load(name).get("lakefs", "") if name == "full_size" else \
        load("smoke").get("runs", {}).get("after", {}).get("lakefs", "")
    return ", against the lakeFS API double" if "double" in said else ""


def readme_table(times: dict[str, dict]) -> str:
    """The README's notebook table."""
    lines = ["| # | notebook | what it teaches | smoke size | full size |", "|---|---|---|---|---|"]
    for number, (title, teaches) in NOTEBOOKS.items():
        path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb")).name
        lines.append(f"| {number} | [{title}](notebooks/{path}) | {teaches} | {duration(times[number]['smoke'])} | "
                     f"{duration(times[number]['full'])} |")
    return "\n".join(lines)


def accuracy_line() -> str:
    """Notebook 04's full-size accuracy, recomputed from its checkpoint, and the baseline's where one ran."""
    full = load("full_size")
    row = next((r for r in full.get("rows", []) if r["notebook"] == "04" and r["status"] == "ok"), None)
    if row is None or row.get("test accuracy recomputed from the checkpoint") is None:
        return "Its full-size accuracy is not measured yet: `make bench` measures it."
    line = (f"At full size it reaches {row['test accuracy recomputed from the checkpoint']:.2%} on all 10,000 test "
            f"images, recomputed from its checkpoint in the bucket, in {duration(row['seconds'])}")
    base = full.get("baseline_04")
    if base and base.get("status") == "ok":
        line += (f"; the defaults it replaced (SGD at a fixed lr of 0.05, layers [128, 64], batches of 64) reached "
                 f"{base['test accuracy']:.2%} in {duration(base['seconds'])} in the same run, on a stack of its own")
        if row.get("training seconds") and base.get("training seconds"):
            line += f" (training alone: {secs(row['training seconds'])} s against {secs(base['training seconds'])} s)"
    return line + " (`benchmarks/results/full_size.json`)."


def time_row(number: str, times: dict[str, dict]) -> str:
    """A notebook's **Time** row."""
    smoke_what, full_what = SIZES[number]
    note = lakefs_note("smoke") if number == "06" else ""
    full_note = lakefs_note("full_size") if number == "06" else ""
    return (f"| **Time** (2-core laptop, stack running) | {duration(times[number]['smoke'])} at smoke size "
            f"({smoke_what}{note}); {duration(times[number]['full'])} at full size ({full_what}{full_note}) |")


# --- docs/results.md: every measured number on it, written from the JSON --------------------------------------

NOT_MEASURED = "Not measured yet: run `make bench`."
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
         10: "ten", 11: "eleven", 12: "twelve"}
ORDINALS = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}
# upload_listing.json's listing methods, as a reader knows them
LISTINGS = {"recursive": "recursive (the original article's)", "parallel": "parallel, one listing per label prefix",
            "manifest": "the manifest (one GET)"}
# data_loading.json's readers; {threads} and {actors} come from the JSON
READERS = {"tasks": "tasks: the original article's function, a client per batch, sequential GETs",
           "actors": "actors ({actors}): one client per actor, {threads} concurrent GETs each",
           "read_images": "`read_images` through pyarrow S3",
           "parquet": "packed Parquet shards of decoded pixels",
           "ceiling": "ceiling: threaded GETs in one process, no decoding",
           "(packing the shards, once)": "packing the shards (once, before the Parquet read)"}
PACKING = "(packing the shards, once)"
# scale.json's steps, as a reader knows them
STEPS = {"upload": "upload, notebook 01's append mode", "list, recursive": "listing, recursive",
         "list, manifest": "listing, from the manifest", "Ray Data, actors": "Ray Data, notebook 03's fetch actors",
         "packing": "packing into Parquet shards", "Ray Data, packed shards": "Ray Data, reading the packed shards",
         "epoch, streamed": "one Ray Train epoch, streamed from Ray Data",
         "epoch, cached shards": "one Ray Train epoch, from the cached shards",
         "inference": "notebook 07's batch inference (the test images)"}
EVERY_START = "every start counted"  # the smoke.json run whose floors count trials, Serve and model actors too
# why a notebook pays the same start more than once (the floors of the smoke path)
REPEATED_STARTS = {"03": "its Ray Data pipelines are timed one by one so the learner can rank them: dropping one "
                         "would drop the comparison the notebook teaches",
                   "04": "every fit pays Ray Train's start again",
                   "05": "its data comes through notebook 03's pipelines, then the sweep pays Tune's start",
                   "07": "the predictions are written, then read back and filtered, each a pipeline of its own",
                   "06": "every experiment is a Ray Train run, and every fit pays Ray Train's start again"}


def count(value: float | None) -> str:
    """``70,000``: a whole number with thousands separators; ``—`` where nothing was measured."""
    return "—" if value is None else f"{round(value):,}"


def secs(value: float | None) -> str:
    """Seconds: two significant digits under one (``0.033``), three under 100 (``3.07``), whole seconds above."""
    if value is None:
        return "—"
    if abs(value) < 1:
        return f"{value:.2g}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def percent(fraction: float | None) -> str:
    """An accuracy in 0..1 as a percentage, to at most two decimals: ``96.86%``, ``87%``."""
    if fraction is None:
        return "—"
    return f"{fraction * 100:.2f}".rstrip("0").rstrip(".") + "%"


def times(ratio: float | None) -> str:
    """A ratio: ``1.55x``, ``25.5x``, ``930x``; ``—`` where it cannot be computed."""
    if ratio is None:
        return "—"
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def ratio_of(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None where either is missing or the denominator is zero."""
    return None if numerator is None or not denominator else numerator / denominator


def word(number: int) -> str:
    """``two`` for 2: small counts in prose read as words."""
    return WORDS.get(number, str(number))


def plural(number: int, noun: str, words: bool = False) -> str:
    """``1 fit``, ``2 fits``; ``two fits`` with ``words``."""
    return f"{word(number) if words else number} {noun}{'' if number == 1 else 's'}"


def span(values: list[float], fmt=secs) -> str:
    """``3.1-4.2``: the lowest and the highest of ``values``, or the one value where they are equal."""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"


def value_text(key: str, value) -> str:
    """One fact of a results row as a reader reads it: accuracies in percent, seconds, counts, yes or no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and "accuracy" in key and 0 <= value <= 1:
        return percent(value)
    if isinstance(value, int | float) and "second" in key:
        return f"{secs(value)} s"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return count(value)
    if isinstance(value, float):
        return secs(value)
    return f"[{', '.join(str(v) for v in value)}]" if isinstance(value, list) else str(value)


def fact_text(key: str, value) -> str:
    """``load 48.2 s``, ``test accuracy 96.88%``: a notebook's fact as its summary names it."""
    if key.endswith(" seconds") and isinstance(value, int | float):
        return f"{key.removesuffix(' seconds')} {secs(value)} s"
    return f"{key} {value_text(key, value)}"


def wrapped(block: str, width: int = 100) -> str:
    """A paragraph or a list filled to ``width`` columns; tables, headings, images and "Measured" lines as they are."""
    if block.startswith(("|", "#", "!", "Measured ")):
        return block
    paragraphs = re.split(r"\n(?=- )", block) if block.startswith("- ") else [block]
    return "\n".join(textwrap.fill(text, width, subsequent_indent="  " if text.startswith("- ") else "",
                                    break_long_words=False, break_on_hyphens=False) for text in paragraphs)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def measured_on(data: dict, script: str) -> str:
    """The section's first line: the day the JSON was written, the machine's cores and the script that wrote it."""
    cpus = data.get("machine", {}).get("cpus")
    where = f" on {word(cpus)} cores" if cpus else ""
    return (f"Measured {str(data.get('measured_at', 'on an unknown day'))[:10]}{where} by "
            f"[`benchmarks/{script}`](../benchmarks/{script}).")


def code_literal(path: Path, name: str):
    """The literal assigned to ``name`` at the top of ``path`` (a dict of defaults), or None where there is none."""
    import ast

    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(
            node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return ast.literal_eval(node.value)
    return None


def search_space_names() -> list[str]:
    """The parameters notebook 05's sweep searches today: the keys ``helpers.sweeps.search_space`` returns."""
    import ast

    for node in ast.parse((ROOT / "helpers" / "sweeps.py").read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "search_space":
            returned = next(n.value for n in ast.walk(node) if isinstance(n, ast.Return))
            if isinstance(returned, ast.Dict):
                return [key.value for key in returned.keys if isinstance(key, ast.Constant)]
    return []


def upload_listing_section(data: dict) -> list[str]:
    """Upload with 1 to 16 threads and the three listings, from ``upload_listing.json``."""
    upload, listing = data.get("upload", []), data.get("listing", [])
    out = [measured_on(data, "bench_upload_listing.py"), f"Against the embedded object store "
           f"(`{data.get('object_store', '?')}`)."]
    if upload:
        first = upload[0]["objects/s"]
        out.append(markdown_table(
            [f"upload ({count(upload[0].get('objects'))} objects)", "seconds", "objects/s", "speed-up"],
            [[r["method"], secs(r.get("seconds")), count(r["objects/s"]), times(ratio_of(r["objects/s"], first))]
             for r in upload]))
    if listing:
        base = next((r for r in listing if r["method"] == "recursive"), listing[0])["seconds"]
        out.append(markdown_table(
            [f"listing ({count(listing[0].get('train pointers'))} training pointers)", "seconds",
             "speed-up vs recursive"],
            [[LISTINGS.get(r["method"], r["method"]), secs(r["seconds"]), times(ratio_of(base, r["seconds"]))]
             for r in listing]))
    cpus = data.get("machine", {}).get("cpus", 2)
    said = f"On {word(cpus)} cores the client and the server share the CPU"
    if len(upload) > 1:
        best = max(upload, key=lambda r: r["objects/s"])
        said += f": uploads reach {times(best['objects/s'] / upload[0]['objects/s'])} one thread's rate with " \
                f"{best['method']}"
        before = upload[upload.index(best) - 1] if upload.index(best) > 0 else None
        if before and best["objects/s"] / before["objects/s"] < 1.2:
            said += f", hardly more than with {before['method']}"
    parallel = next((r for r in listing if r["method"] == "parallel"), None)
    said += (", and listings are bound by the MinIO SDK parsing XML, which threads cannot parallelise"
             + (f" (the parallel listing ran at {times(ratio_of(base, parallel['seconds']))} the recursive one's "
                "speed here)" if parallel and listing else "")
             + ". Against a remote store, where round trips dominate, parallel listings help; the manifest wins "
               "everywhere: it is one GET.")
    out.append(said)
    out.append("Checking a bucket object by object (`upload_mnist(..., verify=True)`, notebook 01's default and the "
               "repair) costs a listing and encoding every image again to compare sizes and ETags. Notebooks 02-07 "
               "only need to know the data is there, so they call `upload_mnist(..., verify=False)`: one GET of the "
               "manifest when it names every planned key.")
    return out


def data_loading_section(data: dict) -> list[str]:
    """Notebook 03's readers at each size, and what packing costs and saves, from ``data_loading.json``."""
    rows = data.get("rows", [])
    out = [measured_on(data, "bench_data_loading.py"), "Notebook 03: the same training pointers turned into "
           "normalised tensors, each reader timed to a full `materialize()` after a warm-up that starts Ray's "
           "workers; task CPU from Ray's own stats."]
    names = {"threads": data.get("threads", "?"), "actors": plural(data.get("num_actors", 0), "actor")}
    table = []
    for size in sorted({r["size"] for r in rows}):
        by = {r["method"]: r for r in rows if r["size"] == size}
        tasks, ceiling = by.get("tasks", {}).get("images/s"), by.get("ceiling", {}).get("images/s")
        for r in by.values():
            rate = r.get("images/s")
            share = ratio_of(rate, ceiling)
            table.append([count(size), READERS.get(r["method"], r["method"]).format(**names), secs(r.get("seconds")),
                          count(rate), times(ratio_of(rate, tasks)), "—" if share is None else f"{share:,.0%}",
                          secs(r.get("remote_cpu_s"))])
    out.append(markdown_table(["images", "reader", "seconds", "images/s", "vs tasks", "vs ceiling", "task CPU s"],
                              table))
    if not rows:
        return out
    largest = max(r["size"] for r in rows)
    by = {r["method"]: r for r in rows if r["size"] == largest}
    if {"tasks", "actors", "parquet", PACKING} <= by.keys():
        pack, shards = by[PACKING]["seconds"], by["parquet"]["seconds"]
        actors, tasks = by["actors"]["seconds"], by["tasks"]["seconds"]
        said = (f"Packing the shards took {secs(pack)} s, once: one more pass over every object (the same GETs and "
                f"decoding as the actors) and a write. The shards hold `uint8` pixels, so a read is a few GETs and a "
                f"scaling: {secs(shards)} s for {count(largest)} images, {times(actors / shards)} faster than the "
                f"actors and {times(tasks / shards)} than the tasks reader")
        if by["parquet"].get("remote_cpu_s") is not None:
            said += f", of which the read tasks compute {secs(by['parquet']['remote_cpu_s'])} s"
        said += "."
        if actors > shards:
            reads = max(1, math.ceil(pack / (actors - shards)))
            said += (f" Packing pays back from the {ORDINALS.get(reads, f'{reads}th')} read of the data (an epoch "
                     f"read from the store, a sweep, another experiment): packing and {plural(reads, 'read', True)} of "
                     f"the shards take {secs(pack + reads * shards)} s, {plural(reads, 'read', True)} by the actors "
                     f"{secs(reads * actors)} s.")
        else:
            said += " Here packing does not pay back: the shards read no faster than the actors."
        out.append(said)
    cpu = [by[m]["remote_cpu_s"] for m in ("tasks", "actors") if by.get(m, {}).get("remote_cpu_s") is not None]
    if cpu and "actors" in by and "tasks" in by:
        cpus = data.get("machine", {}).get("cpus", 2)
        out.append(
            f"On {word(cpus)} cores the client's CPU is the limit for the per-object readers, not the network: every "
            f"object costs Python on the client (request signing, HTTP, response parsing, then decoding: Ray's stats "
            f"show {span(cpu)} s of task CPU for {count(largest)} images, {max(cpu) / largest * 1000:.1f} ms an "
            f"image at most), and loopback round trips are short, so overlapping them with threads gains "
            f"{times(by['actors']['images/s'] / by['tasks']['images/s'])} over sequential fetches. Against a remote "
            "store with milliseconds of latency the concurrent actors pull ahead; packed shards win everywhere "
            "because they remove the per-object request.")
    smallest = min(r["size"] for r in rows)
    per_object = ("tasks", "actors", "read_images")
    if smallest != largest:
        small = [r["images/s"] for r in rows if r["size"] == smallest and r["method"] in per_object]
        large = [r["images/s"] for r in rows if r["size"] == largest and r["method"] in per_object]
        if small and large:
            out.append(f"At {count(smallest)} images the per-object readers manage {span(small, count)} images/s, "
                       f"against {span(large, count)} at {count(largest)}: a fixed start (scheduling, listing, worker "
                       "processes) weighs on small reads.")
    return out


def params_text(params: dict) -> str:
    """``optimizer sgd, lr 0.05, hidden_sizes [128, 64]``: parameters as the code names them."""
    return ", ".join(f"`{key}` {json.dumps(value)}" for key, value in params.items())


def training_section(data: dict) -> list[str]:
    """Notebook 04's loop in Ray Train and in plain PyTorch, and its full-size accuracy, from ``training.json``."""
    params, rows = data.get("params", {}), data.get("rows", [])
    out = [measured_on(data, "bench_training.py")]
    used = f"The run used (`params`): {params_text(params)}; {plural(data.get('num_workers', 0), 'worker')}."
    defaults = code_literal(ROOT / "helpers" / "training.py", "DEFAULT_PARAMS") or {}
    bench_own = ("epochs", "batch_size_per_worker", "seed", "cache_shard")  # the benchmark's arguments
    changed = {key: value for key, value in defaults.items()
               if key not in bench_own and params.get(key) != value}
    if changed:
        used += (" Notebook 04's defaults are now " + ", ".join(
            f"`{key}` {json.dumps(value)}" + (f" (the run: {json.dumps(params[key])})" if key in params
                                              else " (the run: none)") for key, value in changed.items())
                 + " (`helpers/training.py`): this measures the model it had then.")
    out.append(used)
    full = data.get("full_size", {})
    history = data.get("ray_history", [])
    samples = history[0].get("samples") if history else None
    if full:
        out.append(f"On all {count(samples)} training images the model reaches "
                   f"**{percent(full.get('test_accuracy'))} test accuracy after {full.get('epochs')} epochs**, in "
                   f"{secs(full.get('training_seconds'))} s of training after {secs(full.get('load_seconds'))} s of "
                   "loading and preprocessing.")
    batch = params.get("batch_size_per_worker", 0) * data.get("num_workers", 0)
    out.append(f"Throughput per epoch (the median of the epochs after the first), the same global batch of "
               f"{count(batch)}, the same per-batch work (loss and accuracy sums) in every loop:")
    out.append(markdown_table(
        ["loop", "samples/s", "epoch s", "waiting for data s", "compute s"],
        [[re.sub(r"\b1 thread\(s\)", "1 thread", r["loop"]).replace("(s)", "s"), count(r.get("samples/s")),
          secs(r.get("epoch s")), secs(r.get("data s (rank 0)")), secs(r.get("compute s (rank 0)"))] for r in rows]))
    same, streamed = data.get("same_threads_ratio"), data.get("same_threads_ratio_streaming")
    said = []
    if same is not None:
        said.append(f"With the same thread count one Ray Train worker runs at **{times(same)}** the plain loop "
                    f"(`same_threads_ratio`): Ray's own overhead per epoch (a report, a checkpoint when due, an "
                    f"all-reduce of three sums) is {'small' if same >= 0.9 else 'not small here'}.")
    if streamed is not None:
        stream = next((r for r in rows if "Ray Data every epoch" in r["loop"]), {})
        cost = ""
        if stream.get("data s (rank 0)") and samples and batch:
            cost = f", {stream['data s (rank 0)'] / math.ceil(samples / batch) * 1000:.1f} ms a batch"
        said.append(f"Streaming every epoch through Ray Data instead runs at {times(streamed)}: Ray Data's iterator "
                    f"prepares each batch in the worker's own process (format conversion, local shuffle{cost}), "
                    "which costs about as much as this model's step and competes with it for the worker's core.")
    said.append("So notebook 04 keeps each worker's shard in memory after the first epoch (`cache_shard`) and "
                "shuffles it with `torch.randperm`; leave it off for shards that do not fit.")
    plain = [r for r in rows if r["loop"].startswith("plain PyTorch")]
    if len(plain) == 2 and plain[1].get("samples/s", 0) < plain[0].get("samples/s", 0):
        said.append(f"In this run {plain[1]['loop'].rsplit(', ', 1)[-1]} were slower than one: the machine was "
                    "busy.")
    workers = data.get("num_workers", 0)
    if workers > 1 and samples and batch:
        sizes = [784, *params.get("hidden_sizes", []), 10]
        weights = sum(a * b + b for a, b in itertools.pairwise(sizes))
        said.append(f"With {word(workers)} workers every one of the {count(math.ceil(samples / batch))} steps of an "
                    "epoch also all-reduces the gradients over gloo. Data parallelism pays for larger models or one "
                    f"GPU per worker, not for a {count(weights)}-parameter MLP on "
                    f"{word(data.get('machine', {}).get('cpus', 2))} cores.")
    out.append(" ".join(said))
    return out


def sweeps_section(sweeps: dict[str, dict], smoke: dict) -> list[str]:
    """Notebook 05's sweep with ASHA and without at each size, from ``tune_*.json``."""
    runs = sorted(sweeps.values(), key=lambda d: d.get("args", {}).get("smoke_test_size", 0))
    first = runs[0]
    args = first.get("args", {})
    out = [measured_on(first, "bench_tune.py") if len(runs) == 1 else
           f"Measured {', '.join(sorted({str(d.get('measured_at', '?'))[:10] for d in runs}))} (one run per size) on "
           f"{word(first.get('machine', {}).get('cpus', 2))} cores by "
           "[`benchmarks/bench_tune.py`](../benchmarks/bench_tune.py)."]
    concurrent = args.get("max_concurrent", args.get("max_concurrent_trials"))
    out.append(f"{plural(args.get('num_samples', 0), 'trial')} of up to {args.get('epochs')} epochs, HyperOpt from "
               f"the known-good point (notebook 04's defaults), {concurrent} at once, seed {args.get('seed')}, with "
               "and without ASHA. The runs used (`args`): " + "; ".join(
                   f"{count(d.get('args', {}).get('smoke_test_size'))} images: "
                   + params_text({k: v for k, v in d.get("args", {}).items() if k not in ("bucket", "smoke_test_size")})
                   for d in runs)
               + ". The JSON does not record the search space: notebook 05's is now "
               + ", ".join(f"`{name}`" for name in search_space_names())
               + " (`helpers/sweeps.py`); a run measured before that space was set measured another.")
    table = []
    for d in runs:
        size = d.get("args", {}).get("smoke_test_size")
        for r in d.get("rows", []):
            val = r.get("best val_accuracy", r.get("best val acc"))
            test = r.get("best test_accuracy", r.get("best test acc"))
            table.append([count(size), r.get("scheduler", "?"), count(r.get("trials")), count(r.get("epochs run")),
                          secs(r.get("seconds")), secs(r.get("trials/min")), percent(val), percent(test)])
    out.append(markdown_table(["images", "scheduler", "trials", "epochs run", "seconds", "trials/min",
                               "best validation acc", "its test acc"], table))
    gains = [(d.get("args", {}).get("smoke_test_size"), d.get("asha_speedup")) for d in runs]
    epochs = [(next((r["epochs run"] for r in d.get("rows", []) if r.get("scheduler") == "asha"), None),
               next((r["epochs run"] for r in d.get("rows", []) if r.get("scheduler") == "none"), None)) for d in runs]
    shares = [ratio_of(a, n) for a, n in epochs if a is not None and n]
    if shares and all(g is not None for _, g in gains):
        said = (f"ASHA runs {span(shares, lambda s: f'{s:.0%}')} of the epochs; the wall-time gain ("
                + ", ".join(f"{times(g)} at {count(size)} images" for size, g in gains) + ")")
        grows = len(gains) > 1 and all(a[1] < b[1] for a, b in itertools.pairwise(gains))
        said += (" grows with the cost of an epoch, since at small sizes each trial's fixed cost (a trial's start, "
                 "a checkpoint upload per epoch) dominates." if grows else
                 " is smaller than the share of epochs saved: each trial's fixed cost (a trial's start, a checkpoint "
                 "upload per epoch) does not shrink with ASHA.")
        out.append(said + " Finished trials hand their process to the next (`reuse_actors=True`), which skips a "
                   "Python and PyTorch start per trial.")
    nb05 = next((r for r in smoke.get("runs", {}).get("after", {}).get("notebooks", []) if r["notebook"] == "05"), {})
    parts, counts = nb05.get("breakdown_seconds", {}), nb05.get("breakdown_counts", {})
    if "sweep" in parts:
        trials = counts.get("tune: trial")
        out.append("In [the smoke path](#the-smoke-path) notebook 05's own sweep"
                   + (f" ({plural(trials, 'trial')})" if trials else "") + f" took {secs(parts['sweep'])} s.")
    return out


def smoke_rows(run: dict) -> dict[str, dict]:
    """A smoke run's notebooks by number."""
    return {row["notebook"]: row for row in run.get("notebooks", [])}


def ok_seconds(row: dict | None) -> float | None:
    """A notebook's seconds where it ran to the end, else None."""
    return row.get("seconds") if row and row.get("status") in (["ok"], "ok") else None


def where_the_seconds_go(row: dict, largest: int = 4) -> str:
    """A notebook's largest spans, largest first: ``sweep 6.0, tune: trial 4.28 (6)``."""
    parts, counts = row.get("breakdown_seconds", {}), row.get("breakdown_counts", {})
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:largest]
    return ", ".join(f"{label} {secs(seconds)}" + (f" ({counts[label]})" if counts.get(label, 1) > 1 else "")
                     for label, seconds in top)


def starts_text(row: dict, run: dict) -> str:
    """The starts a notebook pays, each at what it costs empty: ``2 fits x 8.0 s, 7 pipelines x 1.53 s``."""
    fit = run.get("ray_train_empty_fit", {}).get("seconds")
    actor_pipeline = run.get("empty_ray_data_pipeline_two_actors_seconds")
    task_pipeline = run.get("empty_ray_data_pipeline_tasks_seconds")
    sweep = run.get("empty_tune_sweep", {}).get("seconds")
    process = run.get("new_worker_process_with_torch", {}).get("seconds")
    parts = []
    for key, noun, each in (("fits", "fit", fit), ("pipelines", "pipeline", actor_pipeline),
                            ("actor pipelines", "actor pipeline", actor_pipeline),
                            ("task pipelines", "task pipeline", task_pipeline), ("sweeps", "sweep", sweep),
                            ("trials", "trial", process),
                            ("serve starts", "Serve start", run.get("empty_serve_seconds")),
                            ("model loads", "model load", run.get("model_load_new_process_seconds"))):
        number = row.get(key)
        if isinstance(number, dict):  # a notebook row's pipelines: {"actors": n, "tasks": n}
            number = sum(number.values())
        if number:
            parts.append(plural(number, noun) + (f" x {secs(each)} s" if each is not None else ""))
    return ", ".join(parts) or "none beyond kernel and Ray"


def starts_count(row: dict) -> int:
    """How many fits, pipelines and sweeps a floors row counts, in either format of ``smoke.json``."""
    pipelines = row.get("pipelines") or 0
    counted = ("fits", "actor pipelines", "task pipelines", "sweeps", "trials", "serve starts", "model loads")
    return sum(row.get(key) or 0 for key in counted) + (
        sum(pipelines.values()) if isinstance(pipelines, dict) else pipelines)


def floors_table(run: dict) -> str:
    """A smoke run's floors: every key the run has, the target beside the multiple it judges."""
    floors = run.get("floors", {})
    keys = {key for row in floors.values() for key in row}
    older = "multiple" in keys  # the older floors: the target judges the one-fit multiple
    columns: list[tuple[str, Callable[[str, dict], str]]] = [
        ("notebook", lambda number, _: number), ("seconds", lambda _, r: secs(r.get("seconds"))),
        ("kernel + Ray start", lambda _, r: secs(r.get("kernel and ray start")))]

    def target(_, row: dict) -> str:
        """``at most 3x: missed``: a row's target and whether its multiple met it."""
        if row.get("target") is None:
            return "—"
        return f"at most {row['target']:g}x: " + ("met" if row.get("met") else "missed")

    if "floor" in keys:
        columns.append(("floor: + one empty fit", lambda _, r: secs(r.get("floor"))))
    if older:
        columns.append(("multiple", lambda _, r: times(r.get("multiple"))))
        columns.append(("target", target))
    columns.append(("starts counted", lambda _, r: starts_text(r, run)))
    if "floor_each_start" in keys:
        columns.append(("floor, every start counted", lambda _, r: secs(r.get("floor_each_start"))))
    if "multiple_each_start" in keys:
        columns.append(("multiple", lambda _, r: times(r.get("multiple_each_start"))))
    if not older and "target" in keys:
        columns.append(("target", target))
    return markdown_table([name for name, _ in columns],
                          [[cell(number, row) for _, cell in columns] for number, row in floors.items()])


def ray_label(run: dict) -> str:
    """Which Ray a smoke run ran on, in words."""
    return "`make lab`'s Ray, its dashboard on" if run.get("ray") == "lab" else "the stack's Ray"


def smoke_section(smoke: dict) -> list[str]:
    """The smoke path: every notebook at its defaults, where the seconds go, and its floors, from ``smoke.json``."""
    runs = smoke.get("runs", {})
    after = runs.get("after")
    if not after:
        return [NOT_MEASURED]
    lab = next((run for run in runs.values() if run.get("ray") == "lab"), None)
    rows, lab_rows = smoke_rows(after), smoke_rows(lab or {})
    out = [measured_on(after, "bench_smoke.py"), f"Every notebook at its default parameters of that day (the JSON "
           f"records no parameters) on a warm stack, on {ray_label(after)}, "
           + ("one run" if after.get("repeats", 1) == 1 else f"the median of {plural(after['repeats'], 'run', True)}")
           + f"; notebook 06 against {after.get('lakefs', 'lakeFS')}."
           + (f" The same notebooks on {ray_label(lab)}, measured {str(lab.get('measured_at'))[:10]}, beside them."
              if lab else "")]
    out.append("Seconds, and in brackets yardsticks: one epoch of a plain PyTorch loop timed in the same run "
               f"({secs(after.get('yardstick_seconds'))} s here), so runs on machines of different speed compare. "
               "The breakdown comes from spans the driver's plumbing records (`helpers/timings.py`: kernel start, "
               "Ray start, the timed cells) and, for the epochs and the trials, from MLflow's own timestamps (the "
               "epochs rank 0 logged, the trials' child runs): the lesson code holds no timer. Spans nest "
               "(`training` holds the `train:` spans); a count in brackets is how many spans were summed. "
               "`smoke.json` also keeps every cell's duration, and every run listed below.")
    header = ["notebook", "seconds (yardsticks)"] + ([f"on {ray_label(lab)}"] if lab else []) + [
        "where the seconds go (s), largest first"]
    table = []
    for number, row in rows.items():
        shown = (f"{secs(row['seconds'])} ({row.get('yardsticks', '—')})" if ok_seconds(row) is not None
                 else "/".join(row.get("status", ["?"])))
        beside = [secs(ok_seconds(lab_rows.get(number)))] if lab else []
        table.append([number, shown, *beside, where_the_seconds_go(row)])
    first_five = [ok_seconds(rows.get(n)) for n in ("01", "02", "03", "04", "05")]
    if None not in first_five:
        total = sum(first_five)
        sticks = [rows[n].get("yardsticks") for n in ("01", "02", "03", "04", "05")]
        shown = f"{secs(total)} ({sum(sticks):.1f})" if None not in sticks else secs(total)
        table.append(["01-05", shown, *(["—"] if lab else []), ""])
    out.append(markdown_table(header, table))

    fit, worker = after.get("ray_train_empty_fit", {}), after.get("new_worker_process_with_torch", {})
    if fit:
        up = fit.get("up_after_seconds", {})
        out.append("### Ray Train's start")
        out.append(
            "What notebook 04's training waits for before its first epoch is Ray Train's own start: process starts. "
            "The benchmark times it on its own, a `TorchTrainer.fit()` with two workers whose loop only reports "
            "once, and reads from Ray's actor table what that fit started and when each actor was up, counted from "
            f"`fit()`: {plural(fit.get('actors', 0), 'actor')}, each a new Python process ("
            + ", ".join(f"`{name}` at {secs(seconds)} s" for name, seconds in up.items())
            + f"); the fit returns at {secs(fit.get('seconds'))} s ({fit.get('yardsticks')} yardsticks), before any "
              "data, epoch or checkpoint."
            + (f" One new Ray worker process importing PyTorch and Ray Train takes {secs(worker.get('seconds'))} s "
               f"({worker.get('yardsticks')} yardsticks)." if worker else "")
            + " Every `fit()` starts a new controller and new worker processes. Preloading PyTorch in Ray's idle "
              "workers (`RAY_preload_python_modules`) does not help: every new worker then imports PyTorch, and "
              "Ray Train's actors, which carry a `runtime_env`, are not given the idle workers. The yardstick, a "
              "PyTorch epoch, measures compute, which a faster machine speeds up more than process starts and "
              "imports.")
    out.append("### What the smoke path no longer pays")
    local = next((run for label, run in runs.items() if "local Ray" in label), None)
    joined = [r["breakdown_seconds"]["ray start"] for r in rows.values() if "ray start" in r.get("breakdown_seconds",
                                                                                                  {})]
    started = [r["breakdown_seconds"]["ray start"] for r in smoke_rows(local or {}).values()
               if "ray start" in r.get("breakdown_seconds", {})]
    ray_start = ""
    if joined:
        ray_start = f" (its `ray start` span: {span(joined)} s in the run above"
        ray_start += (f"; starting a local Ray per notebook: {span(started)} s in the run "
                      f"\"{next(label for label, run in runs.items() if run is local)}\")" if started else ")")
    out.append("\n".join([
        f"- **One Ray for every notebook**: the stack starts one (`workshop.ray_service`) and every notebook joins it "
        f"with `ray.init(address=...)`{ray_start} instead of starting its own (GCS, raylet, a dashboard process and "
        "agents). A local Ray's workers inherit the settings instead of a job `runtime_env` (which kept Ray from "
        "using the workers it starts ahead of time), and so do Ray Train's `RAY_TRAIN_*` settings.",
        "- **A lighter `import ray`**: `rfc3987-syntax` built an IRI grammar on import, imported by `jsonschema`, "
        "which Ray imports in every process; JupyterLab pulls the package in, `make install` removes it. Every "
        "kernel and every Ray worker process (Ray Train's controller and workers, Ray Data's actors and tasks: a "
        "new job gets new ones) paid it.",
        "- **No distributed sort for a smoke size's rows**: `load_datasets` ordered its splits with Ray Data's `sort` "
        "and `filter`, which started new tasks and worker processes; the driver now orders the rows (they fit) and "
        "`from_blocks` hands them back without a metadata task.",
        "- **Cached shards**: after the first epoch each training worker trains from its shard in memory "
        "(`cache_shard`; see [Training](#training) for full size).",
        "- Ray Train's controller polls its workers more often than its default; a checkpoint every "
        "`checkpoint_every` epochs in notebook 04; one actor pipeline for both splits in `load_datasets`; shards of "
        "decoded pixels."]))

    out.append("### Every run `smoke.json` keeps")
    kept = []
    for label, run in runs.items():
        by = smoke_rows(run)
        five = [ok_seconds(by.get(n)) for n in ("01", "02", "03", "04", "05")]
        kept.append([label, str(run.get("measured_at", "?"))[:10], str(run.get("repeats", "?")),
                     secs(run.get("yardstick_seconds")), secs(sum(five)) if None not in five else "—",
                     secs(ok_seconds(by.get("04"))), secs(ok_seconds(by.get("06")))])
    out.append(markdown_table(["run", "measured", "repeats", "yardstick s", "01-05 s", "04 s", "06 s"], kept))
    sticks = [run["yardstick_seconds"] for run in runs.values() if run.get("yardstick_seconds")]
    out.append(f"The runs differ in code, as their labels say, and in the machine's speed: the yardstick ranged from "
               f"{secs(min(sticks))} s to {secs(max(sticks))} s ({times(max(sticks) / min(sticks))}). The "
               "notebooks' seconds are mostly process starts and imports, which a PyTorch epoch does not track, so "
               "the yardsticks compare runs only roughly.")
    targets = after.get("targets", {})
    if targets:
        out.append("Targets in yardsticks, as first set (`targets_in_yardsticks`), against the run above:")
        out.append(markdown_table(["check", "measured", "target", "met"], [
            [name, "—" if t.get("measured") is None else f"{t['measured']:g}", f"{t.get('target')}",
             {True: "yes", False: "no", None: "—"}[t.get("met")]] for name, t in targets.items()]))

    out.append("### Against its floor")
    out.append("A PyTorch epoch does not measure what the smoke path waits for, so `bench_smoke.py` judges each Ray "
               "notebook against a floor measured in the same run, on the same Ray: the notebook's own kernel start, "
               "imports and Ray start, plus each start it pays, at what that start costs with no work in it: a Ray "
               "Train fit whose loop only reports once, a one-row Ray Data pipeline, a Tune sweep of notebook "
               "05's trials that only report once.")
    every = runs.get(EVERY_START)
    for run in (after, lab):
        if run and run.get("floors"):
            out.append(f"On {ray_label(run)}, yardstick {secs(run.get('yardstick_seconds'))} s:")
            out.append(floors_table(run))
    if every and every.get("floors"):
        out.append(f"With every start counted (`{EVERY_START}`, measured {str(every.get('measured_at'))[:10]}): each "
                   "Tune trial at a new worker process importing PyTorch, each Serve start at `serve.start` and "
                   "`serve.run` of a deployment that does nothing, each model actor (07's pool, 08's replica) at a new "
                   "worker process loading the champion, all timed in that run:")
        out.append(floors_table(every))
    notes = []
    for number, row in after.get("floors", {}).items():
        if starts_count(row) > 1 and row.get("floor_each_start") is not None:
            starts = row["floor_each_start"] - row.get("kernel and ray start", 0)
            notes.append(f"- **{number}** pays {starts_text(row, after)}: {secs(starts)} s of its "
                         f"{secs(row.get('seconds'))} s are starts with no work in them"
                         + (f"; {REPEATED_STARTS[number]}" if number in REPEATED_STARTS else "") + ".")
    if notes:
        out.append("Where a notebook repeats a start, the lesson asks for it:\n\n" + "\n".join(notes))
    out.append("The right floor for a notebook that repeats a start is the one that counts each start, read from the "
               "same run." + (" `smoke.json` keeps both (`floors`: `multiple` for the target as it was set, "
                              "`multiple_each_start` beside it)." if any(
                                  "multiple" in row for row in after.get("floors", {}).values()) else ""))
    return out


def serve_section(data: dict) -> list[str]:
    """Notebook 08's deployment, with and without batching, against a plain HTTP server, from ``serve.json``."""
    rows = data.get("rows", [])
    out = [measured_on(data, "bench_serve.py"), "The same model and the same JSON requests (a test image as a "
           "base64 PNG) behind three servers: Python's `ThreadingHTTPServer` in one process (the baseline, one "
           "forward pass per request), and notebook 08's `DigitClassifier` on the stack's Ray with one replica, "
           f"without batching (`max_batch_size` 1) and with it ({data.get('max_batch_size', 16)}, notebook 08's). "
           "Each load runs for "
           f"{secs(data.get('seconds_per_load'))} s per number of concurrent clients, the clients in a process of "
           "their own; the ratios are against the baseline at the same number of clients, measured in the same "
           "run:", "![p99 latency and throughput by concurrent clients, one line per server](serve.png)"]
    out.append(markdown_table(["server", "clients", "p50 ms", "p95 ms", "p99 ms", "answers/s", "p99 vs plain",
                               "answers/s vs plain", "failed"], [
        [r["server"], str(r["clients"]), secs(r["p50_ms"]), secs(r["p95_ms"]), secs(r["p99_ms"]),
         count(round(r["throughput"])), times(r["p99_vs_plain"]), times(r["throughput_vs_plain"]), str(r["errors"])]
        for r in rows]))
    if rows:
        plain = [r for r in rows if r["server"].startswith("plain")]
        served = [r for r in rows if not r["server"].startswith("plain")]
        faster = all(r["throughput_vs_plain"] < 1 for r in served)
        tail = [r for r in served if r["p99_vs_plain"] < 1]
        said = ("The plain server answers more requests per second at every load: each request is one hop, "
                "where Serve's proxy hands it to the replica through Ray, on the same cores."
                if faster else "Serve answers more requests per second than the plain server at some loads.")
        if tail:
            worst = max(plain, key=lambda r: r["clients"])
            said += (f" Serve's tail is shorter at {', '.join(sorted({str(r['clients']) for r in tail}))} clients: "
                     f"there the plain server's p99 is {worst['p99_ms']} ms with {worst['errors']} failed requests, "
                     "its queue of waiting connections full, while Serve queues every request and answers it.")
        out.append(said + " Batching costs a lone client its wait for company and pays once many clients wait.")
    return out


def inference_section(data: dict) -> list[str]:
    """Notebook 07's pipeline against the same job in the driver, from ``inference.json``."""
    rows = data.get("rows", [])
    actors = data.get("num_actors", 0)
    out = [measured_on(data, "bench_inference.py"), "Notebook 07's pipeline (notebook 03's fetch actors, "
           f"{plural(actors, 'model actor', True)}, Parquet written to the bucket) against the same job in the "
           "driver (a thread pool fetches, then decode and predict in one process, nothing written), the same "
           f"MLflow model, medians of {plural(data.get('repeats', 1), 'run', True)} on a warm Ray; the test images "
           "first, then the training images, as notebook 07 reads them:"]
    out.append(markdown_table(["images", "Ray Data pipeline", "driver", "faster"], [
        [count(r["images"]), f"{secs(r['ray_data_s'])} s ({count(r.get('ray_data_images_per_s'))} images/s)",
         f"{secs(r['driver_s'])} s",
         f"{r.get('faster', '?')}, {times(max(r['ray_data_s'], r['driver_s']) / min(r['ray_data_s'], r['driver_s']))}"]
        for r in rows]))
    if rows:
        cpus = data.get("machine", {}).get("cpus", 2)
        driver = [r for r in rows if r["ray_data_s"] > r["driver_s"]]
        ratios = [r["ray_data_s"] / r["driver_s"] for r in rows]
        said = (f"On {word(cpus)} cores the driver wins at every size" if len(driver) == len(rows) else
                f"The driver wins at {plural(len(driver), 'size')} of {len(rows)}")
        said += (f": the pipeline starts {word(2 * actors)} actor processes (torch and the model loaded in each model "
                 f"actor) and shares the same {word(cpus)} cores with them.")
        if all(a > b for a, b in itertools.pairwise(ratios)):
            said += (f" The gap closes as the data grows ({', '.join(times(r) for r in ratios)}), since the start is "
                     "paid once.")
        out.append(said + " The pipeline is what still works when the data outgrows one process or the model needs "
                   "GPUs on other machines, without a change to its code.")
    return out


def full_size_section(data: dict) -> list[str]:
    """Every notebook at full size, one after the other in one run, from ``full_size.json``."""
    rows = data.get("rows", [])
    out = [measured_on(data, "bench_full_size.py"), "`smoke_test_size=0`: every image, each notebook at its "
           "other defaults of that day (the JSON records no parameters), one after the other on the same stack and "
           f"bucket; notebook 06 against {data.get('lakefs', 'lakeFS')}."]
    out.append(markdown_table(["notebook", "status", "time", "what it reported"], [
        [r["notebook"], str(r.get("status")), duration(r.get("seconds")),
         "; ".join(fact_text(key, value) for key, value in r.items()
                   if key not in ("notebook", "status", "seconds") and value is not None)] for r in rows]))
    said = []
    if data.get("ratio_06_to_04") is not None:
        target = data.get("target_ratio")
        said.append(f"Notebook 06 took **{times(data['ratio_06_to_04'])}** notebook 04's time in the same run"
                    + (f" (target: at most {target:g}x, {'met' if data.get('met') else 'missed'})"
                       if target is not None else "")
                    + ": its experiments are Ray Train runs of notebook 04's loop, side by side on data listed and "
                      "preprocessed once, and the reproduction from the chosen experiment's commit lists the commit, "
                      "which names the same objects as the experiments' data (an experiment's commit adds a model, "
                      "not images), so `read_once` hands back the datasets the same pointers gave before in the "
                      "kernel.")
    base = data.get("baseline_04")
    if base:
        said.append(f"Notebook 04 of `{base.get('ref')}`, the code it replaced, ran in the same run: "
                    f"{base.get('status')} in {duration(base.get('seconds'))}"
                    + (f", test accuracy {percent(base['test accuracy'])}" if base.get("test accuracy") is not None
                       else "")
                    + (f"; now {times(data['ratio_04_to_baseline'])} its time" if data.get("ratio_04_to_baseline")
                       is not None else "") + ".")
    alone = data.get("07 without lakeFS")
    if alone and alone.get("status") == "ok":
        said.append(f"Notebook 07 ran once more as a learner without lakeFS runs it, with `@champion` first on "
                    f"{alone['champion before']}: it served {alone['model source']}, test accuracy "
                    f"{percent(alone['test_accuracy from the Parquet'])} on {alone['images predicted']:,} images "
                    "(notebook 06's rule, held in 07: the day's best model is clearly better on validation).")
    if said:
        out.append(" ".join(said))
    return out


def scale_section(scale: dict) -> list[str]:
    """How each step's cost grows with the bucket, and the driver's memory, from ``scale.json``."""
    runs = scale.get("runs", {})
    after = runs.get("after") or next(iter(runs.values()), None)
    if not after:
        return [NOT_MEASURED]
    rows, limit = after.get("rows", []), scale.get("limit_largest_over_smallest")
    sizes = [r["objects"] for r in rows]
    out = [measured_on(after, "bench_scale.py"), f"In `make bench`: the bucket grown by notebook 01's append mode "
           f"(each round another {count(sizes[0]) if sizes else '?'} images) to "
           + ", ".join(count(n) for n in sizes) + " objects, every step measured at each size in one run. It works "
           f"in a bucket of its own (`{after.get('bucket')}`, emptied first; `--cleanup` deletes it afterwards), so "
           "the notebooks' `mnist` bucket is never touched. Seconds per 100,000 objects (or images, or samples); "
           "linear growth keeps a row flat, and the last column is the cost per object at the largest size over the "
           "cost at the smallest" + (f" (at most {limit:g} counts as linear)." if limit is not None else ".")]
    growth = after.get("growth", [])
    per_size = [key for key in (growth[0] if growth else {}) if key.startswith("s per 100k")]
    upload_rates = ", ".join(count(r.get("upload_objects_per_s")) for r in rows)
    out.append(markdown_table(
        ["step (seconds per 100,000)", *[key.removeprefix("s per 100k at ") for key in per_size], "largest / smallest"],
        [[STEPS.get(g["step"], g["step"]) + (f" (the last round's objects/s: {upload_rates})" if g["step"] == "upload"
                                            else ""),
          *[secs(g.get(key)) for key in per_size], f"{g['largest / smallest']:.2f}" if g.get(
              "largest / smallest") is not None else "—"] for g in growth]))
    if (ROOT / "docs" / "scale.png").is_file():
        out.append("![Each step's seconds against the bucket's size, log-log, with a dotted line of linear growth "
                   "from the first size](scale.png)")
    linear = [g for g in growth if g.get("largest / smallest") is not None and limit is not None
              and g["largest / smallest"] <= limit]
    said = [f"{word(len(linear)).capitalize()} of the {word(len(growth))} steps are linear or better: where a fixed "
            "start (actor processes, Ray Train's workers, a model loaded per actor) is paid once, the cost per object "
            "falls as the data grows."]
    notes = []
    before = runs.get("before")
    rounds = [s for r in rows for s in r.get("upload_round_seconds", [])]
    upload = next((g for g in growth if g["step"] == "upload"), {})
    if before and rounds:
        earlier = [s for r in before.get("rows", []) for s in r.get("upload_round_seconds", [])]
        was = next((g for g in before.get("growth", []) if g["step"] == "upload"), {})
        notes.append(
            f"- **The upload**: in the run \"before\" ({before.get('note', 'the code before')}), each round of the "
            f"same {count(sizes[0])} images took {', '.join(secs(s) for s in earlier)} s"
            f" ({was.get('largest / smallest', '—')}x per object at the largest size). A new round's keys are new "
            "(UUIDs derived from the round's id), so nothing of it can be in the bucket yet: it now reads the "
            "manifest (one GET) instead, and lists only when it resumes an interrupted round. After: "
            f"{', '.join(secs(s) for s in rounds)} s ({upload.get('largest / smallest', '—')}x).")
    manifest = next((g for g in growth if g["step"] == "list, manifest"), None)
    if manifest and len(rows) > 1 and "rss_manifest" in rows[0]:
        small, large = rows[0], rows[-1]
        text = [r["rss_manifest"]["pointer_text_bytes"] / r["rss_manifest"]["pointers"] for r in (small, large)]
        per_byte = ((large["list_manifest_s"] / large["rss_manifest"]["pointer_text_bytes"])
                    / (small["list_manifest_s"] / small["rss_manifest"]["pointer_text_bytes"]))
        notes.append(
            f"- **The manifest listing grows {manifest['largest / smallest']:.2f}x per object, and {per_byte:.2f}x "
            "per byte.** The appended images' keys are longer than the originals' (`train/7/<36-character "
            f"UUID>.png` against `train/7/12345.png`): {text[0]:.1f} bytes of key per object at "
            f"{count(small['objects'])}, {text[1]:.1f} at {count(large['objects'])}, so the manifest's text grows "
            f"{large['rss_manifest']['pointer_text_bytes'] / small['rss_manifest']['pointer_text_bytes']:.1f}x for "
            f"{large['objects'] / small['objects']:g}x the objects, and the time with it "
            f"({small['list_manifest_s'] * 1000:.0f} ms to {large['list_manifest_s'] * 1000:.0f} ms). It is one GET "
            "and a split.")
    out.append(" ".join(said) + (f" {word(len(notes)).capitalize()} {'row needs' if len(notes) == 1 else 'rows need'} "
                                 "a word:\n\n" + "\n".join(notes) if notes else ""))
    memory = after.get("memory", {})
    if memory and rows:
        out.append("### The driver's memory")
        out.append(f"A fresh process lists the bucket and holds the pointer lists (`X_train, y_train, X_test, "
                   f"y_test`); its peak RSS is measured from after its imports (`/proc/self/clear_refs`, then "
                   f"`VmHWM`). From {count(rows[0]['objects'])} to {count(rows[-1]['objects'])} objects:")
        out.append(markdown_table(
            ["listing", "peak RSS growth MB", "extra key text MB", "the same as Python strings MB",
             "growth / strings", "growth / text"],
            [[method, f"{m['peak_rss_growth_mb']:.1f}", f"{m['extra_pointer_text_mb']:.1f}",
              f"{m['extra_pointer_objects_mb']:.1f}", f"{m['growth_over_pointer_objects']:.2f}x",
              times(ratio_of(m["peak_rss_growth_mb"], m["extra_pointer_text_mb"]))] for method, m in memory.items()]))
        out.append("Each `str` carries a header besides its characters, and each list a pointer per key, so the "
                   "strings the driver holds weigh more than their text. The manifest path's extra is the manifest's "
                   "own text, held while it is split. Nothing else the driver keeps grows with the data: Ray Data's "
                   "blocks live in the object store and its workers, not in the driver.")
    return out


def site_section(data: dict) -> list[str]:
    """``make site``'s time and the site's size, from ``site.json`` (``bench_site.py``)."""
    builds = data.get("builds", [])
    mib = 2**20
    out = [measured_on(data, "bench_site.py"), f"`make site` (`python -m workshop.site`) run "
           f"{plural(len(builds), 'time', True)}, each in a fresh process into an empty folder: Sphinx reads and "
           "writes every page from scratch with warnings as errors, then every link, anchor and asset of the site "
           "is checked ([the website](site.md)). CPU is the build's user and system time, what it costs on a "
           f"machine with nothing else to do; the wall time was measured with the machine's load average at "
           f"{data.get('load_average', '?')} (other work running beside it):"]
    out.append(markdown_table(["", "median", "fastest", "slowest"], [
        ["wall", f"{secs(data['median_wall_s'])} s", f"{secs(min(b['wall_s'] for b in builds))} s",
         f"{secs(max(b['wall_s'] for b in builds))} s"],
        ["CPU", f"{secs(data['median_cpu_s'])} s", f"{secs(min(b['cpu_s'] for b in builds))} s",
         f"{secs(max(b['cpu_s'] for b in builds))} s"]]))
    out.append(f"The site: {data['pages']} pages, {count(data['files'])} files, {data['bytes'] / mib:.1f} MiB:")
    out.append(markdown_table(["part", "MiB", "share"], [
        [part["part"], f"{part['bytes'] / mib:.2f}", percent(round(part["bytes"] / data["bytes"], 2))]
        for part in data["parts"]]))
    return out


def kit_section(data: dict) -> list[str]:
    """The workshop kit's size per platform and the installs side by side, from ``kit.json`` (``bench_kit.py``)."""
    kit, morning = data["kit"], data.get("morning", {})
    out = [measured_on(data, "bench_kit.py"), f"`make kit` built the kit for {', '.join(data['platforms'])} "
           f"(Python 3.11) in {secs(kit['build s'])} s: {kit['folder GB']} GB in all, pure-Python wheels once for "
           "every platform. What a learner fetches from it, and how much of that is PyTorch's CUDA libraries, which "
           "PyPI's Linux PyTorch carries whether or not the machine has a GPU "
           "([a CPU-only PyTorch](quickstart.md#platforms)):"]
    out.append(markdown_table(["platform", "a learner fetches", "of which CUDA", "lakeFS in the kit"], [
        [name, f"{size} GB", f"{kit.get(f'{name} cuda GB', 0)} GB", "yes" if kit["lakeFS"].get(name) else
         "no: not fetched here (no route to GitHub); notebook 06 is skipped"]
        for name, size in kit["per learner GB"].items()]))
    out.append("A fresh clone installed side by side in one run, one after the other: from the package registry "
               "as `make install` does with internet (pip), from the kit's folder (`make install KIT=`), and from "
               "`make kit-serve` on loopback (`make install INDEX=`) with one learner and with three at once; the "
               "installs from the kit ran in a network namespace with loopback only. The .venv counts each file "
               "once (uv links the files it unpacks):")
    out.append(markdown_table(["installed from", "learners at once", "seconds", "each learner's seconds",
                               ".venv", "of which CUDA"], [
        [row["from"], str(row["learners"]), secs(row["seconds"]),
         ", ".join(secs(s) for s in row.get("each s", [row["seconds"]])), f"{row['venv GB']} GB",
         f"{row['venv CUDA GB']} GB"] for row in data["installs"]]))
    if morning:
        notebooks = ", ".join(f"{n} {secs(s)} s" for n, s in morning["notebooks s"].items())
        skipped = f"; {', '.join(morning['skipped'])} skipped (no lakeFS in the kit)" if morning["skipped"] else ""
        out.append(f"A learner's whole morning from the kit, with the network cut: a fresh clone, `make install "
                   f"KIT=`, then `make run` (the stack started and every notebook at its defaults) took "
                   f"{duration(morning['total s'])}: the install {secs(morning['install s'])} s, the notebooks "
                   f"({notebooks}{skipped}) and the stack's start and the run's own work "
                   f"{secs(morning['stack start and the rest s'])} s.")
    return out


def results_page() -> str:
    """``docs/results.md``: every benchmark's tables and what they show, written from ``benchmarks/results/``."""
    names = ("upload_listing", "data_loading", "training", "tune_600", "tune_12000", "smoke", "inference",
             "serve", "full_size", "scale", "site", "kit")
    data = {name: load(name) for name in names}
    machines = [d.get("machine", {}) for d in data.values()] + [
        run.get("machine", {}) for name in ("smoke", "scale") for run in data[name].get("runs", {}).values()]
    cpus = sorted({m["cpus"] for m in machines if m.get("cpus")})
    sticks = [run["yardstick_seconds"] for run in data["smoke"].get("runs", {}).values()
              if run.get("yardstick_seconds")]
    swing = f" (up to {times(max(sticks) / min(sticks))} by the yardsticks of the smoke runs)" if sticks else ""
    machine = "- and ".join(str(n) for n in cpus) + "-core, no-GPU" if cpus else "no-GPU"
    out = ["# Measured results",
           f"What `make bench` measured on the {machine} reference machine, against the embedded object "
           "store. `make bench` writes the JSON in `benchmarks/results/`; this page is written from it by "
           "`python benchmarks/report.py`: never edit it by hand, re-run the benchmark and the script. Compare "
           f"seconds within one table: the machine's speed changes from day to day{swing}, so each comparison is "
           "measured in one run. The `use_gpu=True` path is not benchmarked; what is tested of it without a GPU is "
           "in [docs/tests.md](tests.md). Back to the [README](../README.md)."]
    sections = [
        ("Upload and listing", ["upload_listing"], lambda: upload_listing_section(data["upload_listing"])),
        ("Data loading", ["data_loading"], lambda: data_loading_section(data["data_loading"])),
        ("Training", ["training"], lambda: training_section(data["training"])),
        ("Sweeps", ["tune_600", "tune_12000"],
         lambda: sweeps_section({n: data[n] for n in ("tune_600", "tune_12000") if data[n]}, data["smoke"])),
        ("The smoke path", ["smoke"], lambda: smoke_section(data["smoke"])),
        ("Batch inference", ["inference"], lambda: inference_section(data["inference"])),
        ("Online predictions", ["serve"], lambda: serve_section(data["serve"])),
        ("Full size", ["full_size"], lambda: full_size_section(data["full_size"])),
        ("How the cost grows", ["scale"], lambda: scale_section(data["scale"])),
        ("The website", ["site"], lambda: site_section(data["site"])),
        ("The workshop kit", ["kit"], lambda: kit_section(data["kit"])),
    ]
    for title, files, render in sections:
        out.append(f"## {title}")
        out += render() if any(data[name] for name in files) else [NOT_MEASURED]
    return "\n\n".join(wrapped(part) for block in out for part in block.split("\n\n")) + "\n"


def between(text: str, markers: tuple[str, str], body: str) -> str:
    """``text`` with what stands between the two markers replaced by ``body``."""
    start, end = text.index(markers[0]) + len(markers[0]), text.index(markers[1])
    return text[:start] + "\n" + body + "\n" + text[end:]


def serving_lines() -> str:
    """Notebook 08's endpoint against the plain HTTP server at 1 and 32 clients (``bench_serve.py``)."""
    rows = load("serve").get("rows", [])
    if not rows:
        return "Serving is not measured yet: `make bench` measures it (`benchmarks/bench_serve.py`)."
    cells = {(r["server"], r["clients"]): r for r in rows}
    most = max(r["clients"] for r in rows)
    lines = ["| server | p99 at 1 client | p99 at " f"{most} clients | answers/s at {most} clients | failed |",
             "|---|---|---|---|---|"]
    for server in dict.fromkeys(r["server"] for r in rows):
        one, many = cells.get((server, 1), {}), cells.get((server, most), {})
        failed = sum(r.get("errors", 0) for r in rows if r["server"] == server)
        lines.append(f"| {server} | {one.get('p99_ms', '—')} ms | {many.get('p99_ms', '—')} ms | "
                     f"{many.get('throughput', '—')} | {failed} |")
    return ("Notebook 08's endpoint against the same model behind a plain one-process HTTP server, measured side "
            f"by side in one run ({load('serve')['machine']['cpus']} CPUs; `benchmarks/results/serve.json`, "
            "[chart](docs/serve.png)):\n\n" + "\n".join(lines))


def rewritten() -> dict[Path, str]:
    """Every file this script writes, as it should read."""
    times = measured()
    readme = between(between(README.read_text(), TABLE, readme_table(times)), ACCURACY, accuracy_line())
    readme = between(readme, SERVING, serving_lines())
    out = {README: readme, RESULTS_PAGE: results_page()}
    for number in NOTEBOOKS:
        path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "markdown" and source.startswith("## Before you start"):
                row = time_row(number, times)
                new = re.sub(r"^\| \*\*Time\*\*.*$", lambda _, row=row: row, source, flags=re.MULTILINE)
                cell["source"] = new.splitlines(keepends=True) if isinstance(cell["source"], list) else new
        out[path] = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    """Write (or ``--check``) what the measurements say; exit 1 on ``--check`` when a file differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    differ = []
    for path, text in rewritten().items():
        if path.read_text() != text:
            differ.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text)
    for path in differ:
        print(f"{'differs from the measurements' if args.check else 'rewritten'}: {path}")
    return 1 if args.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
