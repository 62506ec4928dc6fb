"""The embedded stack's ports: the defaults, the ones a stack chose and saved, and moving those another program holds.

Each stack keeps its ports in ``ports.json`` in its state folder, with the ones the user gave
(``--s3-port ...``), which are never moved. On a machine shared by several learners each stack starts on
the default ports where they are free and moves the others: nobody has to pick ports by hand.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from helpers.ports import free_port_candidates, port_is_free
from helpers.private_files import write_private
from workshop import seaweedfs_security
from workshop.processes import remembered_process, stop_orphans
from workshop.state_files import RESET_HINT, StackError, read_state_json, state_paths

# Every port the stack listens on; gRPC ports are passed explicitly so two
# stacks (a dev stack and a test stack) can run side by side.
DEFAULT_PORTS = {
    "s3": 8333, "s3_grpc": 18333,
    "master": 9333, "master_grpc": 19333,
    "volume": 8081, "volume_grpc": 18081,
    "filer": 8889, "filer_grpc": 18889,  # not 8888: JupyterLab's port
    "admin": 23646, "admin_grpc": 33646,
    "mlflow": 5050,  # not 5000: macOS AirPlay's port
    "lakefs": 8000,
    "ray": 6390,  # Ray's GCS; not Ray's default 6379, where a Ray of the learner's own may listen
}


class PortInUseError(StackError):
    """A port the stack needs is taken by another program."""


def free_ports(names: list[str]) -> dict[str, int]:
    """Distinct free ports, one per name (used by tests), from 20000 to the kernel's ephemeral range."""
    chosen = dict(zip(names, (port for port in free_port_candidates(2000) if port_is_free(port)), strict=False))
    if "admin" in chosen and "admin_grpc" in chosen:  # SeaweedFS's worker dials the admin's port + 10000
        chosen["admin"] = free_port("admin", set(chosen.values()))
        chosen["admin_grpc"] = chosen["admin"] + 10_000
    return chosen


def check_ports(ports: dict[str, int], where: str = "") -> None:
    """Raise :class:`StackError` unless every port is a whole number in 1-65535 and no two are the same."""
    for name, port in ports.items():
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise StackError(f"Port {name}={port!r}{where} is not a port number: use a whole number from 1 to 65535.")
    taken: dict[int, str] = {}
    for name, port in ports.items():
        if port in taken:
            raise StackError(f"Ports {taken[port]} and {name}{where} are both {port}: every service needs its own.")
        taken[port] = name


GIVEN_KEY = "given"  # in ports.json: the ports the user chose (--s3-port ...), which are never moved


def port_taken(name: str, port: int) -> bool:
    """Whether another program (another user's stack, say) holds ``port``, or SeaweedFS's gRPC socket for it."""
    if not port_is_free(port):
        return True
    service = name.removesuffix("_grpc")
    return name.endswith("_grpc") and service in seaweedfs_security.GRPC_SERVICES and bool(
        seaweedfs_security.foreign_grpc_sockets({name: port}))


def free_port(name: str, avoid: set[int]) -> int:
    """A free port for ``name`` from 20000 up to the ephemeral range, none of ``avoid``.

    The admin port comes with its gRPC port 10000 above it: SeaweedFS's worker dials that one, whatever
    ``-admin.port.grpc`` says.
    """
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    top = min(max(low, 24_000), 55_535) if name == "admin" else max(low, 24_000)
    for port in secrets.SystemRandom().sample(range(20_000, top), 4000):
        pair = [port, port + 10_000] if name == "admin" else [port]
        if not avoid & set(pair) and not any(port_taken(name, p) for p in pair):
            return port
    raise StackError(f"No free port for {name} between 20000 and {top}: stop some programs, then run up again.")


def move_taken_ports(ports: dict[str, int], names: list[str], given: set[str]) -> dict[str, str]:
    """Move each of ``names`` whose port another program holds to a free port, unless the user chose it.

    On a machine shared by several learners each stack starts on the default ports where they are free
    and on free ports where another learner's stack holds them: nobody has to pick ports by hand.
    Returns ``{name: "old -> new"}`` for every port moved; ``ports`` is changed in place.
    """
    moved = {}
    for name in names:
        if name in given or name == "admin_grpc" or not port_taken(name, ports[name]) and not (
                name == "admin" and port_taken("admin_grpc", ports["admin_grpc"])):
            continue
        new = free_port(name, set(ports.values()))
        moved[name] = f"{ports[name]} -> {new}"
        ports[name] = new
        if name == "admin":
            ports["admin_grpc"] = new + 10_000
    return moved


def load_or_choose_ports(state: Path, overrides: dict[str, int] | None) -> tuple[dict[str, int], set[str]]:
    """The stack's ports (saved, else the defaults, each taken one moved) and those the user chose."""
    path = state_paths(state)["ports"]
    if overrides:
        check_ports(overrides)  # before anything is saved: a bad port must not stick
    ports, given = dict(DEFAULT_PORTS), set()
    if path.is_file():
        saved = read_state_json(path)
        try:
            check_ports({k: v for k, v in saved.items() if k in DEFAULT_PORTS}, where=f" in {path}")
        except StackError as err:
            raise StackError(f"{err} Reset it: {RESET_HINT.format(path=path)}.") from None
        ports.update({k: v for k, v in saved.items() if k in DEFAULT_PORTS})
        given = {name for name in saved.get(GIVEN_KEY, []) if name in DEFAULT_PORTS}
    else:  # a new stack: the defaults, except where another program (another learner's stack) holds one
        move_taken_ports(ports, list(DEFAULT_PORTS), set(overrides or {}))
    ports.update(overrides or {})
    given |= set(overrides or {})
    check_ports(ports)
    save_ports(state, ports, given)
    return ports, given


def save_ports(state: Path, ports: dict[str, int], given: set[str]) -> None:
    """Keep ``ports`` in the state's ``ports.json``, with the names the user gave."""
    write_private(state_paths(state)["ports"], json.dumps({**ports, GIVEN_KEY: sorted(given)}, indent=2))


def saved_ports(state: Path) -> dict[str, int]:
    """The ports ``ports.json`` names, the defaults for the others (nothing is chosen or saved)."""
    ports_file = state_paths(state)["ports"]
    saved = read_state_json(ports_file) if ports_file.is_file() else {}
    return {**DEFAULT_PORTS, **{name: port for name, port in saved.items() if name in DEFAULT_PORTS}}


def wait_released(ports: dict[str, int], names: list[str], seconds: float = 1.5) -> None:
    """Give ports a process stopped just now may hold a moment longer that moment (they are ours, not taken)."""
    deadline = time.monotonic() + seconds
    while any(not port_is_free(ports[name]) for name in names) and time.monotonic() < deadline:
        time.sleep(0.1)


def check_ports_free(service: str, ports: dict[str, int], names: list[str]) -> None:
    """Raise :class:`PortInUseError`, naming the port and the flag that moves it, where another program holds one."""
    deadline = time.monotonic() + 1.5  # a service stopped just now may hold its ports a moment longer
    for name in names:
        while not port_is_free(ports[name]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not port_is_free(ports[name]):
            flag = {"s3": "--s3-port", "mlflow": "--mlflow-port", "lakefs": "--lakefs-port",
                    "ray": "--ray-port"}.get(name, "--port-base")
            fix = ("start the lab's dashboard on another: `make lab LAB_ARGS=\"--dashboard-port N\"`"
                   if name == "dashboard"
                   else f"start the stack on other ports: `python -m workshop.stack up {flag} N`")
            raise PortInUseError(
                f"Port {ports[name]} ({service} {name}) on 127.0.0.1 is already in use by another program. "
                f"Stop that program, or {fix}."
            )


SEAWEEDFS_PORTS = [name for name in DEFAULT_PORTS if name not in ("mlflow", "lakefs", "ray")]
SERVICE_PORTS = {"seaweedfs": SEAWEEDFS_PORTS, "mlflow": ["mlflow"], "lakefs": ["lakefs"], "ray": ["ray"]}


def ports_taken_meanwhile(state: Path) -> list[str]:
    """The ports of services that are not running which another program holds now, and which the stack chose."""
    if not state_paths(state)["ports"].is_file():  # refused before any port was chosen
        return []
    ports, given = load_or_choose_ports(state, None)
    return [f"{name} {ports[name]}" for service in SERVICE_PORTS if remembered_process(state, service) is None
            for name in SERVICE_PORTS[service] if name not in given and name != "admin_grpc"
            and port_taken(name, ports[name])]


def move_ports_of_stopped_services(state: Path) -> None:
    """New free ports for every port the stack chose (not the user) of each service that is not running."""
    ports, given = load_or_choose_ports(state, None)
    for service in SERVICE_PORTS:
        if remembered_process(state, service) is None:
            for name in SERVICE_PORTS[service]:
                if name not in given and name != "admin_grpc":
                    ports[name] = free_port(name, set(ports.values()))
                    if name == "admin":
                        ports["admin_grpc"] = ports[name] + 10_000
    save_ports(state, ports, given)


def free_the_ports(state: Path, ports: dict[str, int], given: set[str], wanted: list[str]) -> list[str]:
    """Stop what killed services left behind (returned by name) and move ports other programs hold."""
    orphaned = [name for name in wanted if stop_orphans(state, name)]  # what a killed service left holds its ports
    wait_released(ports, [port for name in orphaned for port in SERVICE_PORTS[name]])  # theirs: not moved
    moved = move_taken_ports(ports, [port for name in wanted for port in SERVICE_PORTS[name]], given)
    if moved:  # another learner's stack holds them: the next free ones, kept in this stack's state
        save_ports(state, ports, given)
        print("Ports another program holds, moved: " + ", ".join(f"{k} {v}" for k, v in moved.items()))
    return orphaned
