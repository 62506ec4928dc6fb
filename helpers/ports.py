"""Free ports on 127.0.0.1: for the stack's services, and for Serve's proxy in notebook 08."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` (SO_REUSEADDR, so TIME_WAIT doesn't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_candidates(count: int) -> list[int]:
    """``count`` random ports from 20000 up to the kernel's ephemeral range, where no outgoing connection lands.

    Other processes could take one (port-0 binds, Ray's default worker ports 10002-19999 are below) between
    choosing it and binding it: check each with :func:`port_is_free` just before.
    """
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    return secrets.SystemRandom().sample(range(20_000, max(low, 24_000)), count)
