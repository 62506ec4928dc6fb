"""lakeFS in the embedded stack: its configuration file and command line.

A local KV database under the state folder, the S3 blockstore on the embedded object store, the generated
installation keys of :mod:`workshop.credentials`, and no calls home. The binary itself is found or fetched
by :mod:`workshop.lakefs_binary`.
"""

from __future__ import annotations

from pathlib import Path

from helpers.private_files import write_private
from workshop.state_files import state_paths

LAKEFS_BUCKET = "lakefs"  # storage namespaces of the lakeFS repositories (helpers.versioning)


def config(state: Path, ports: dict[str, int], s3_access: str, s3_secret: str, keys: dict[str, str]) -> Path:
    """Write lakeFS's configuration (0600, it holds keys) for this stack's ports and keys; return its path."""
    import yaml

    settings = {
        "listen_address": f"127.0.0.1:{ports['lakefs']}",
        "logging": {"format": "text", "level": "WARN"},
        "database": {"type": "local", "local": {"path": str(state_paths(state)["lakefs_db"])}},
        "auth": {"encrypt": {"secret_key": keys["encrypt_secret"]}},
        "blockstore": {"type": "s3", "s3": {
            "endpoint": f"http://127.0.0.1:{ports['s3']}", "force_path_style": True,
            "discover_bucket_region": False, "region": "us-east-1",
            "credentials": {"access_key_id": s3_access, "secret_access_key": s3_secret},
        }},
        "installation": {"user_name": "tutorial", "access_key_id": keys["access_key_id"],
                         "secret_access_key": keys["secret_access_key"]},
        "stats": {"enabled": False},  # no calls home: the tutorial must work offline
        "security": {"audit_check_url": "", "check_latest_version": False},
    }
    path = state_paths(state)["lakefs_config"]
    write_private(path, yaml.safe_dump(settings, sort_keys=False))
    return path


def command(binary: Path, state: Path, ports: dict[str, int], s3_access: str, s3_secret: str,
            keys: dict[str, str]) -> list[str]:
    """``lakefs run``'s command line, its configuration written first."""
    return [str(binary), "run", "--config", str(config(state, ports, s3_access, s3_secret, keys))]
