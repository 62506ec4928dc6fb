"""What a Ray worker needs in its environment to reach the services, and a Ray that keeps to 127.0.0.1.

Low-level on purpose: the stack's Ray (:mod:`workshop.ray_service`) starts with these settings and every
driver (:mod:`helpers.cluster`) compares or sends them, and neither imports the other for it.
"""

from __future__ import annotations

import os
import sys

from helpers.settings import Settings
from helpers.tracking import bounded_requests

# Set to true where every node of the cluster already has S3_ACCESS_KEY and S3_SECRET_KEY in its
# environment: the keys then never travel in the job's runtime_env.
KEYS_FROM_CLUSTER_ENV = "S3_KEYS_FROM_CLUSTER"


def keys_from_cluster() -> bool:
    """Whether the workers take the object store's keys from their own environment (``S3_KEYS_FROM_CLUSTER``)."""
    return os.environ.get(KEYS_FROM_CLUSTER_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def settings_env(settings: Settings, with_keys: bool = True) -> dict[str, str]:
    """The environment variables that let a worker process build the same settings.

    ``AWS_EC2_METADATA_DISABLED`` stops the AWS SDK inside pyarrow from probing
    the EC2 metadata service, which costs seconds per process off AWS.

    A job's ``runtime_env`` can be read by anyone who can reach the cluster's
    dashboard, state or job API: with ``with_keys=False`` the S3 keys and MLflow's
    password stay out of it, for clusters whose nodes have them in their own environment.
    """
    keys = {"S3_ACCESS_KEY": settings.s3_access_key, "S3_SECRET_KEY": settings.s3_secret_key,
            "MLFLOW_TRACKING_USERNAME": settings.mlflow_username,
            "MLFLOW_TRACKING_PASSWORD": settings.mlflow_password} if with_keys else {}
    values = {
        "AWS_EC2_METADATA_DISABLED": "true",
        "S3_ENDPOINT": settings.s3_url, **keys, "S3_SECURE": str(settings.s3_secure).lower(),
        "S3_REGION": settings.s3_region, "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
        **bounded_requests(),  # a worker's MLflow calls give up in seconds when the server is gone
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # a model loaded in an actor: no bar in the notebook
        **ROOM_ENVIRONMENT,  # also on a cluster's workers, which the room's processes did not start
    }
    return {k: v for k, v in values.items() if v}


# What every process of a learner's room runs with (the stack, the lab, the runner, a driver and its workers).
# Nothing phones home: Ray's usage stats (and Ray Data's usage actor), MLflow's telemetry (client, server and the
# UI's banner). And MLflow loads no pickled model: a model is code, and whoever can write to the registry or the
# bucket could have a pickle's __reduce__ run on the learner's actors; the lessons log pt2, which loads without.
ROOM_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true",
                    "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}


def use_room_environment() -> None:
    """No usage stats, no telemetry, no pickled models: in this process and the processes it starts."""
    os.environ.update(ROOM_ENVIRONMENT)


# A local Ray's defaults, inherited by its processes (a driver's own value wins): Ray Train's controller polls
# reports every 0.2 s, not 2 s, and starts no preemption watcher actor. Not in the driver's environment: Ray
# Train would send them to its actors in a runtime_env, costing each a new worker process.
LOCAL_RAY_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def loopback_interface() -> str:
    """The name of this machine's loopback interface: ``lo`` on Linux, ``lo0`` on macOS."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == "127.0.0.1" for address in addresses):
            return name
    return "lo0" if sys.platform == "darwin" else "lo"


def local_ray_defaults() -> dict[str, str]:
    """:data:`LOCAL_RAY_DEFAULTS`, and Ray Train's gloo on the loopback interface, where a local Ray listens.

    Left to itself gloo binds the address the machine's name resolves to, which on a laptop changes with
    the network (a VPN, a hotel's Wi-Fi) or is not this machine at all, and training workers then cannot
    connect to each other (seen on macOS). ``GLOO_SOCKET_IFNAME`` names the interface instead.
    """
    return {**LOCAL_RAY_DEFAULTS, "GLOO_SOCKET_IFNAME": loopback_interface()}


# Every name settings_env can set: a local Ray starts without any of them left over from other settings.
WORKER_SETTINGS = ("AWS_EC2_METADATA_DISABLED", "S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "S3_SECURE",
                   "S3_REGION", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                   "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", *ROOM_ENVIRONMENT)


def loopback_only() -> None:
    """Make a local Ray listen on 127.0.0.1 only, never on the machine's network address.

    Ray picks the address other machines would reach for a cluster; a laptop's Ray
    needs none, and its GCS, raylet and object manager should not be reachable from the
    network. Ray's own switch for this (loopback on macOS and Windows) is read when
    ``ray`` is imported, so it is set on the imported module; the processes Ray starts
    are handed the address the driver chose. Not through the environment: there it
    would also stop any ``ray start`` run from this process from joining a cluster.
    """
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


# What Ray adds to RAY_TMPDIR for a session's longest socket, with the longest pid Linux gives; and what is added
# before it at the longest, the stack's Ray's own folder (workshop.ray_service). Either must fit a Unix socket's
# path: 107 bytes on Linux, 103 on macOS.
RAY_SESSION_SOCKETS = "/ray/session_2026-12-31_23-59-59_999999_4194304/sockets/plasma_store"
RAY_SOCKETS = "/stack-0123abcd" + RAY_SESSION_SOCKETS


def ray_tmpdir(sockets: str = RAY_SESSION_SOCKETS) -> str:
    """The temporary folder of this user's own that a local Ray gets (:func:`private_ray_tmpdir`), made if missing.

    ``RAY_TMPDIR`` where the environment sets it (the stack's Ray sets it for its workers and jobs); else a
    folder with room for the stack's Ray's sockets (:data:`RAY_SOCKETS`), in ``$TMPDIR`` or else in /tmp, as
    macOS's ``$TMPDIR`` is too long for them. ``sockets`` is what will be added to it: a Ray's own session
    (:data:`RAY_SESSION_SOCKETS`), or the stack's Ray's folder and its session (:data:`RAY_SOCKETS`).

    Raises:
        SocketPathError: a ``RAY_TMPDIR`` set in the environment is too long for Ray's sockets.
    """
    from helpers.private_files import SocketPathError, private_temp_folder, unix_socket_limit

    folder = os.environ.get("RAY_TMPDIR") or str(private_temp_folder("ray", room=len(RAY_SOCKETS)))
    longest, limit = len(folder.encode()) + len(sockets), unix_socket_limit()
    if longest > limit:
        raise SocketPathError(f"RAY_TMPDIR={folder} would give Ray's sockets paths of {longest} bytes, over this "
                              f"system's limit of {limit}: unset RAY_TMPDIR, or set it to a shorter folder")
    return folder


def private_ray_tmpdir() -> None:
    """Give Ray, in this process and the workers it starts, a temporary folder of this user's own.

    Ray keeps its session files in ``/tmp/ray`` and Ray Train's lock files in ``/tmp/_ray_lockfiles``, one
    of each for every user of the machine: the first user's folders lock the others out (another
    learner's training run failed with PermissionError on a lock file), and its session folders are
    writable by everyone. ``RAY_TMPDIR`` (Ray's own variable) moves both (:func:`ray_tmpdir`).

    Raises:
        SocketPathError: a ``RAY_TMPDIR`` set in the environment is too long for Ray's sockets.
    """
    os.environ["RAY_TMPDIR"] = ray_tmpdir()
