"""What keeps the embedded object store to its owner on a machine with other users (the embedded stack).

The S3 port asks for keys, but ``weed mini`` opens more: the master, volume and filer HTTP ports answered
anyone on 127.0.0.1 (a filer listing showed the bucket, the master deleted collections and handed out
volume write tokens), and every gRPC port is an administration interface (``weed shell`` could read and
delete any object). The stack closes them:

* ``security.toml`` (0600, written at every start) holds JWT signing keys, so the volume servers and the
  filer refuse unsigned requests, and mutual TLS for every gRPC port and gRPC socket, with a CA and one
  certificate made here; the CA's private key is never written, so no further certificate can be made;
* ``-disableHttp`` removes the master's and the filer's HTTP APIs (the master would hand out tokens);
* the filer's and the S3 gateway's Unix sockets live in the private state folder, not in ``/tmp``.

Left open, read-only and harmless: health checks, the master's status page, the volume server's
status (bucket names and sizes). SeaweedFS puts its gRPC sockets at fixed names in ``/tmp``, where another
user could create them first; :func:`foreign_grpc_sockets` finds that before a start, and TLS keeps such
a socket from reading or changing anything.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import socket
import ssl
from pathlib import Path

from helpers.private_files import private_folder, private_temp_folder, unix_socket_limit, write_private

GRPC_SERVICES = ("master", "volume", "filer", "s3", "admin")  # the gRPC sockets weed mini opens in /tmp
TLS_ROLES = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq", "client")


def config_dir(state: Path) -> Path:
    """The folder ``weed -config_dir`` reads ``security.toml`` from."""
    return state / "seaweedfs"


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA (its key kept in memory only) and one certificate it signs, for every component; their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "embedded stack CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "seaweedfs")]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "stack.crt", folder / "stack.key"
    write_private(paths[0], ca.public_bytes(serialization.Encoding.PEM).decode())
    write_private(paths[1], leaf.public_bytes(serialization.Encoding.PEM).decode())
    write_private(paths[2], leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()).decode())
    return paths


def write_security(state: Path) -> Path:
    """Write ``security.toml`` with new JWT keys and new certificates (a fresh set at every start); its folder."""
    folder = config_dir(state)
    private_folder(folder)
    private_folder(folder / "tls")
    ca, cert, key = _certificates(folder / "tls")
    lines = ["# Written by `python -m workshop.stack up` at every start; read by `weed -config_dir=...`."]
    for section in ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read"):
        lines += [f"[{section}]", f'key = "{secrets.token_urlsafe(32)}"', "expires_after_seconds = 10"]
    lines += ["[access]", "ui = false", "[filer.expose_directory_metadata]", "enabled = false",
              "[grpc]", f'ca = "{ca}"']
    for role in TLS_ROLES:
        lines += [f"[grpc.{role}]", f'cert = "{cert}"', f'key = "{key}"']
    write_private(folder / "security.toml", "\n".join(lines) + "\n")
    return folder


def socket_paths(state: Path) -> dict[str, Path]:
    """Where the filer's and the S3 gateway's Unix sockets go: the state folder, or a private one if its path is long.

    A Unix socket's path has at most 107 bytes on Linux and 103 on macOS (darwin)
    (:func:`helpers.private_files.unix_socket_limit`); a deep state folder would not fit.
    """
    paths = {name: state / f"{name}.sock" for name in ("filer", "s3")}
    if all(len(str(path).encode()) <= unix_socket_limit() for path in paths.values()):
        return paths
    short = private_temp_folder(f"stack-sockets-{hashlib.sha256(str(state).encode()).hexdigest()[:12]}",
                                room=len("/filer.sock"))
    return {name: short / f"{name}.sock" for name in paths}


def grpc_socket(service: str, port: int) -> Path:
    """The Unix socket ``weed mini`` opens for a gRPC port, at a name it fixes in ``/tmp``."""
    return Path(f"/tmp/seaweedfs-{service}-grpc-{port}.sock")


def foreign_grpc_sockets(ports: dict[str, int]) -> list[Path]:
    """The gRPC socket names of these ports that another user holds in ``/tmp`` (ours, stale, are removed)."""
    found = []
    for service in GRPC_SERVICES:
        if f"{service}_grpc" not in ports:
            continue
        path = grpc_socket(service, ports[f"{service}_grpc"])
        try:
            owner = os.lstat(path).st_uid
        except FileNotFoundError:
            continue
        if owner == os.getuid():
            path.unlink(missing_ok=True)  # left by a stack of ours that was killed
        elif os.getuid() != 0:  # root takes the name over anyway (it may unlink anything in /tmp)
            found.append(path)
    return found


def refuses_plain_clients(port: int, timeout: float = 3.0) -> bool:
    """Whether a gRPC port asks for a client certificate: a TLS handshake without one must fail.

    SeaweedFS starts without TLS, silently, when a certificate file is missing or unreadable; this
    is how the stack knows TLS is really on.
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.settimeout(timeout)
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            tls.recv(1)  # TLS 1.3 reports a missing client certificate at the first read
            return False
    except ssl.SSLError as err:  # a plain-text server answers a handshake with no TLS record at all
        return "CERTIFICATE_REQUIRED" in str(err).upper() or "HANDSHAKE_FAILURE" in str(err).upper()
    except (TimeoutError, OSError):
        return False
