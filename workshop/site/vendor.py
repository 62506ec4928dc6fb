"""The site's vendored web assets: files taken from npm packages, each pinned by version and SHA-256.

The site loads nothing from outside its folder, so a script it needs that no Python package ships
(mermaid, which draws the notebooks' diagrams) is committed under ``workshop/site/static/vendored/``
with its license, and ``vendor.json`` beside it records where each file came from: the package, its
version, its license, the npm registry's integrity of the package and the SHA-256 of the file. The
build checks every file against that record (:func:`verify`) before it starts.

To move an asset to another version (this needs ``npm`` and the npm registry)::

    python -m workshop.site.vendor mermaid@11.16.1

which fetches the package with ``npm pack``, replaces the file and its license, and rewrites its entry
in ``vendor.json``; commit the three. Mermaid's version is the one JupyterLab (requirements.txt)
bundles, so a diagram looks the same on the site as in ``make lab``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import TutorialError

VENDOR_DIR = Path(__file__).resolve().parent / "static" / "vendored"
MANIFEST = VENDOR_DIR / "vendor.json"


@dataclass(frozen=True)
class Source:
    """Which file of an npm package an asset is, and which file holds its license."""

    file: str
    license_file: str


# What each vendored package contributes: mermaid's one-file browser build (every diagram type, no
# chunk loaded later) and its license.
SOURCES = {"mermaid": Source(file="dist/mermaid.min.js", license_file="LICENSE")}


class VendorError(TutorialError):
    """A vendored asset is missing, changed, or could not be fetched."""


def sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest() -> dict[str, dict]:
    """``vendor.json``: for each package, what was vendored from it (see the module's docstring)."""
    return json.loads(MANIFEST.read_text())


def asset_path(package: str) -> str:
    """The site-relative path of ``package``'s vendored file under ``_static/`` (e.g. ``vendored/mermaid-...js``)."""
    return f"vendored/{manifest()[package]['file']}"


def verify() -> None:
    """Check every vendored file against its SHA-256 in ``vendor.json``.

    Raises:
        VendorError: a file is missing or its bytes are not the ones recorded.
    """
    for package, entry in manifest().items():
        for name, digest in ((entry["file"], entry["sha256"]), (entry["license_file"], entry["license_sha256"])):
            path = VENDOR_DIR / name
            if not path.is_file():
                raise VendorError(f"{path} is missing: run `python -m workshop.site.vendor {package}@"
                                  f"{entry['version']}` to fetch it again.")
            if sha256(path) != digest:
                raise VendorError(f"{path} is not the file vendor.json records (SHA-256 differs): restore it from git, "
                                  f"or run `python -m workshop.site.vendor {package}@{entry['version']}`.")


def npm_pack(spec: str, folder: Path) -> tuple[Path, str]:
    """``npm pack spec`` into ``folder``: the tarball and the registry's integrity string.

    Raises:
        VendorError: npm is missing or the package could not be fetched.
    """
    try:
        done = subprocess.run(["npm", "pack", spec, "--json", "--pack-destination", str(folder)], capture_output=True,
                              text=True, timeout=300)
    except FileNotFoundError as error:
        raise VendorError("npm is not installed: vendoring fetches the package with `npm pack`.") from error
    if done.returncode != 0:
        raise VendorError(f"npm pack {spec} failed: {done.stderr.strip().splitlines()[-1:]}")
    packed = json.loads(done.stdout)[0]
    return folder / packed["filename"], packed["integrity"]


def vendor(package: str, version: str) -> dict:
    """Fetch ``package@version`` from npm, write its file and license into the vendor folder, record them.

    Returns:
        The package's new entry in ``vendor.json``.

    Raises:
        VendorError: the package is not one the site vendors, or npm failed.
    """
    if package not in SOURCES:
        raise VendorError(f"The site vendors {sorted(SOURCES)}, not {package!r}.")
    source, entries = SOURCES[package], manifest() if MANIFEST.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        tarball, integrity = npm_pack(f"{package}@{version}", Path(tmp))
        with tarfile.open(tarball) as archive:
            meta = json.load(archive.extractfile("package/package.json"))
            script = archive.extractfile(f"package/{source.file}").read()
            license_text = archive.extractfile(f"package/{source.license_file}").read()
    suffix = source.file.rsplit("/", 1)[-1].split(".", 1)[1]  # mermaid.min.js -> min.js
    names = {"file": f"{package}-{meta['version']}.{suffix}", "license_file": f"{package}-{meta['version']}.LICENSE"}
    for old in (entries.get(package, {}).get(key) for key in names):
        if old:
            (VENDOR_DIR / old).unlink(missing_ok=True)
    VENDOR_DIR.mkdir(parents=True, exist_ok=True)
    (VENDOR_DIR / names["file"]).write_bytes(script)
    (VENDOR_DIR / names["license_file"]).write_bytes(license_text)
    entries[package] = {"version": meta["version"], "license": meta.get("license", ""), "npm_integrity": integrity,
                        "from": f"{package}@{meta['version']}/{source.file}", **names,
                        "sha256": sha256(VENDOR_DIR / names["file"]),
                        "license_sha256": sha256(VENDOR_DIR / names["license_file"])}
    MANIFEST.write_text(json.dumps(dict(sorted(entries.items())), indent=2) + "\n")
    return entries[package]


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.site.vendor PACKAGE@VERSION``: vendor that version; 1 with one line if it failed."""
    parser = argparse.ArgumentParser(description="Fetch a web asset of the site from npm and record it.")
    parser.add_argument("spec", help="PACKAGE@VERSION, e.g. mermaid@11.16.1")
    args = parser.parse_args(argv)
    package, _, version = args.spec.rpartition("@")
    if not package or not version:
        parser.error("name the package and its version: PACKAGE@VERSION")
    try:
        entry = vendor(package, version)
    except VendorError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{package} {entry['version']}: {entry['file']} (SHA-256 {entry['sha256']}), license {entry['license']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
