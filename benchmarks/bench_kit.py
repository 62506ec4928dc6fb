"""The workshop kit measured in one run: its size per platform, and installs side by side.

* the kit for every platform of the lock (``make kit PLATFORMS=...``): what a learner on each fetches, and the
  part of Linux's that is CUDA (PyTorch's GPU libraries, which a CPU laptop never uses);
* a fresh clone installed from the package registry (``make install``), from the kit's folder
  (``make install KIT=``) and from ``make kit-serve`` (``make install INDEX=``) with 1 and with 3 learners at once,
  the kit installs in network namespaces that have only loopback;
* the learner's whole morning from the kit, with the network cut: clone, install, every notebook (``make run``).

Needs root (network namespaces) and about 30 GB of disk at the peak; each learner's .venv is removed after it.

    sudo .venv/bin/python benchmarks/bench_kit.py [--keep-kit runs/bench-kit]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import print_table, write_results

from helpers.settings import project_root
from workshop import kit as kit_module

ROOT = project_root()
PYTHON = os.path.realpath(sys._base_executable)
CUDA = re.compile(r"^(nvidia_|cuda_|triton-)")


@contextlib.contextmanager
def namespace():
    """A network namespace with loopback only; yields the prefix that runs a command in it."""
    name = f"bench-kit-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    try:
        yield ["ip", "netns", "exec", name]
    finally:
        for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "delete", name], check=False)


def learner(top: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A learner's checkout path and shell environment (their own HOME)."""
    home = top / name / "home"
    home.mkdir(parents=True)
    return top / name / "mnist-on-object-storage", {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                                                   "HOME": str(home), "LANG": "C.UTF-8", "TUTORIAL_HEADLESS": "1"}


def timed(command: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, str]:
    """Run ``command``; its seconds and output. Raises on failure."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.perf_counter() - started, done.stdout


def make(prefix: list[str], checkout: Path, env: dict[str, str], *args: str) -> tuple[float, str]:
    """``make`` in a checkout (inside a namespace where ``prefix`` says)."""
    return timed([*prefix, "make", "--no-print-directory", "-C", str(checkout), *args, f"PYTHON={PYTHON}"], env)


def cuda_share(kit: Path, manifest: dict, platform: str) -> dict[str, float]:
    """What of a platform's wheels is CUDA: GB, and how many wheels."""
    wheels = manifest["wheels"][platform]["3.11"]
    cuda = [w for w in wheels if CUDA.match(w["file"])]
    return {"cuda wheels": len(cuda), "cuda GB": round(sum(w["size"] for w in cuda) / 1e9, 2)}


def installed_gb(checkout: Path) -> dict[str, float]:
    """The learner's .venv on disk, and its CUDA libraries' part, in GB (hard links into uv's cache count once)."""
    def size(paths: list[Path]) -> float:
        seen, total = set(), 0
        for path in paths:
            for file in [path] if path.is_file() else path.rglob("*"):
                info = file.lstat()
                if file.is_file() and (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_size
        return round(total / 1e9, 2)

    site = next(checkout.glob(".venv/lib/python*/site-packages"))
    return {"venv GB": size([checkout / ".venv"]),
            "venv CUDA GB": size([p for p in site.iterdir() if re.match(r"^(nvidia|cuda|triton)", p.name)])}


def main() -> int:
    """Build the kit, time the installs and the morning, write ``benchmarks/results/kit.json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep-kit", type=Path, help="build the kit here and keep it (default: a temporary folder)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_kit.py needs root: its learners install in network namespaces with loopback only")
    top = Path(tempfile.mkdtemp(prefix="bench-kit-"))
    kit = args.keep_kit or top / "kit"
    platforms = list(dict.fromkeys([*kit_module.default_platforms(), *kit_module.PLATFORMS]))  # every one, sized
    results: dict[str, object] = {"platforms": platforms}
    try:
        seconds, said = timed([sys.executable, "-m", "workshop.kit", "--kit", str(kit), "--platforms", *platforms],
                              dict(os.environ), cwd=ROOT)
        manifest = json.loads((kit / "manifest.json").read_text())
        results["kit"] = {"build s": round(seconds, 1), "folder GB": round(sum(
            p.stat().st_size for p in kit.rglob("*") if p.is_file()) / 1e9, 2),
            "per learner GB": kit_module.kit_sizes(kit, manifest),
            "lakeFS": {p: p in manifest["lakefs"] for p in platforms},
            **{f"{p} {key}": value for p in platforms if p.startswith("linux")
               for key, value in cuda_share(kit, manifest, p).items()}}
        installs = []
        # from the registry, as make install does with internet
        checkout, env = learner(top, "registry")
        subprocess.run(["git", "clone", "--quiet", str(kit / kit_module.REPOSITORY), str(checkout)], check=True)
        seconds, _ = make([], checkout, env, "install")
        installs.append({"from": "the package registry (pip)", "learners": 1, "seconds": round(seconds, 1),
                         **installed_gb(checkout)})
        shutil.rmtree(checkout.parent)
        with namespace() as prefix:
            checkout, env = learner(top, "folder")
            subprocess.run(["git", "clone", "--quiet", str(kit / kit_module.REPOSITORY), str(checkout)], check=True)
            seconds, _ = make(prefix, checkout, env, "install", f"KIT={kit}")
            installs.append({"from": "the kit's folder (uv), network cut", "learners": 1,
                             "seconds": round(seconds, 1), **installed_gb(checkout)})
            shutil.rmtree(checkout.parent)
            server = subprocess.Popen([*prefix, sys.executable, "-m", "workshop.kit_serve", "--kit", str(kit),
                                       "--port", "0", "--bind", "127.0.0.1"], cwd=ROOT, stdout=subprocess.PIPE,
                                      text=True)
            try:
                index = re.search(r"INDEX=(\S+)", "".join(server.stdout.readline() for _ in range(5)))[1]
                for count in (1, 3):
                    group = [learner(top, f"served-{count}-{n}") for n in range(count)]
                    for checkout, env in group:
                        timed([*prefix, "git", "clone", "--quiet", index + kit_module.REPOSITORY, str(checkout)], env)
                    started = time.perf_counter()
                    running = [(subprocess.Popen([*prefix, "make", "--no-print-directory", "-C", str(checkout),
                                                  "install", f"INDEX={index}", f"PYTHON={PYTHON}"], env=env,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
                                time.perf_counter()) for checkout, env in group]
                    each: dict[int, float] = {}
                    while len(each) < len(running):  # each learner's own time, as it ends
                        for number, (proc, began) in enumerate(running):
                            if number not in each and proc.poll() is not None:
                                if proc.returncode != 0:
                                    raise RuntimeError(f"an install from kit-serve failed: {proc.stderr.read()[-999:]}")
                                each[number] = round(time.perf_counter() - began, 1)
                        time.sleep(0.5)
                    each = [each[number] for number in range(len(running))]
                    installs.append({"from": "make kit-serve on loopback (uv), network cut", "learners": count,
                                     "seconds": round(time.perf_counter() - started, 1), "each s": each,
                                     **installed_gb(group[0][0])})
                    for checkout, _ in group:
                        shutil.rmtree(checkout.parent)
            finally:
                server.terminate()
                server.wait()
            # the morning: a fresh clone from the kit to every notebook run, the network cut
            checkout, env = learner(top, "morning")
            started = time.perf_counter()
            subprocess.run(["git", "clone", "--quiet", str(kit / kit_module.REPOSITORY), str(checkout)], check=True)
            install_s, _ = make(prefix, checkout, env, "install", f"KIT={kit}")
            run_s, said = make(prefix, checkout, env, "run")
            notebooks = {name: float(s) for name, status, s in re.findall(
                r"^(\d\d)_\w+\.ipynb\s+(ok|skipped)\s+([\d.]+)", said, flags=re.MULTILINE)}
            results["morning"] = {"total s": round(time.perf_counter() - started, 1), "install s": round(install_s, 1),
                                  "make run s": round(run_s, 1), "notebooks s": notebooks,
                                  "stack start and the rest s": round(run_s - sum(notebooks.values()), 1),
                                  "skipped": re.findall(r"^(\d\d)_\w+\.ipynb\s+skipped", said, flags=re.MULTILINE)}
            make(prefix, checkout, env, "stack-down")
            shutil.rmtree(checkout.parent)
        results["installs"] = installs
    finally:
        shutil.rmtree(top, ignore_errors=True)
    path = write_results("kit", results)
    print_table("Installs of the locked environment, side by side (one run, this machine)", installs,
                ["from", "learners", "seconds", "venv GB", "venv CUDA GB"])
    print(json.dumps(results["kit"], indent=1))
    print(json.dumps(results["morning"], indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
