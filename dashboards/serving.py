"""Where the dashboard is really served, and whether that is this machine only.

The path box (and a ``?model=<path>`` link) makes the server read a path of the visitor's choosing, so it may be
on only while the dashboard listens on loopback alone, whatever folder Streamlit was started from: the
``.streamlit/config.toml`` that says ``address = "localhost"`` is found through the working directory (and, in
recent Streamlit, beside ``app.py``), and without it Streamlit listens on every interface. What counts is where
the server listens in fact: this process's listening TCP sockets, read from ``/proc`` (Linux). Where none is found
there (another system, or ``AppTest``, which serves nothing), Streamlit's effective ``server.address`` decides,
unset meaning every interface. ``streamlit run dashboards/app.py -- --allow-remote-paths`` keeps the path box on
anyway, for an operator who accepts that everyone who reaches the server can make it read its files.
"""
from __future__ import annotations

import ipaddress
import os
import re
import sys
from pathlib import Path

from sprout_interp.core.errors import ArgumentError

#: the argument after ``--`` that keeps the path box on while the dashboard is reachable from other machines
ALLOW_REMOTE_PATHS = "--allow-remote-paths"
_LISTEN = "0A"  # TCP_LISTEN, as /proc/net/tcp writes a socket's state
_HEX = re.compile(r"[0-9A-Fa-f]+")


def proc_address(hex_address: str) -> str:
    """The IP address (text, e.g. ``"127.0.0.1"`` or ``"::"``) of an address as ``/proc/net/tcp`` and
    ``/proc/net/tcp6`` write it: 8 or 32 hex digits, each 32-bit word in this machine's byte order."""
    if not isinstance(hex_address, str) or len(hex_address) not in (8, 32) or not _HEX.fullmatch(hex_address):
        raise ArgumentError(f"hex_address must be 8 (IPv4) or 32 (IPv6) hex digits as /proc/net/tcp writes them; "
                            f"got {hex_address!r}.")
    raw = b"".join(int(hex_address[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_address), 8))
    return str(ipaddress.ip_address(raw))


#: the last listening sockets found, by the set of this process's socket inodes they were found among
_last_found: tuple[frozenset[str], list[tuple[str, int]]] | None = None


def listening_sockets() -> list[tuple[str, int]] | None:
    """(address, port) of every TCP socket of this process that listens, from ``/proc/net/tcp{,6}`` and
    ``/proc/self/fd``; an empty list when it has none, None where ``/proc`` cannot be read (not Linux).

    Reading the tables can take tens of milliseconds, and every script run asks: while this process holds the
    same sockets as when listeners were last found, that answer is given again."""
    global _last_found
    try:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed since the listing
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        last = _last_found
        if last is not None and last[0] == inodes:
            return list(last[1])
        tables = [Path(t).read_text().splitlines()[1:] for t in ("/proc/net/tcp", "/proc/net/tcp6")
                  if Path(t).exists()]
    except OSError:
        return None
    if not tables:
        return None
    found = []
    for line in (line for table in tables for line in table):
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN or fields[9] not in inodes:
            continue
        addr, _, port = fields[1].rpartition(":")
        found.append((proc_address(addr), int(port, 16)))
    if found:  # only listeners found are kept: a socket already held may start listening without a new inode
        _last_found = (frozenset(inodes), list(found))
    return found


def is_loopback(address: str) -> bool:
    """Whether a listening address reaches this machine only: ``localhost``, 127.0.0.0/8, ``::1`` (also as
    ``::ffff:127.0.0.1``). An unset or empty address (every interface), a host name or a unix socket is not."""
    if address.strip().lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def configured_address() -> str:
    """Streamlit's effective ``server.address`` ("" when unset: Streamlit then listens on every interface)."""
    from streamlit import config

    return config.get_option("server.address") or ""


def served_addresses() -> list[str]:
    """The addresses the dashboard listens on: this process's listening TCP sockets where ``/proc`` shows any,
    else Streamlit's effective ``server.address`` ("" for every interface)."""
    sockets = listening_sockets()
    return sorted({addr for addr, _ in sockets}) if sockets else [configured_address()]


def exposed_addresses(addresses: list[str] | None = None) -> list[str]:
    """Those of ``addresses`` (default :func:`served_addresses`) that other machines may reach: every one that
    is not loopback. Empty when the dashboard is served to this machine only."""
    return [a for a in (served_addresses() if addresses is None else addresses) if not is_loopback(a)]


def shown_address(address: str) -> str:
    """An address as the page names it: ``"every interface (0.0.0.0)"`` for a wildcard, else itself."""
    if address.strip() in ("", "0.0.0.0", "::"):
        return f"every network interface ({address.strip() or 'no address configured'})"
    return address


def remote_paths_accepted(argv: list[str] | None = None) -> bool:
    """Whether the operator passed ``-- --allow-remote-paths`` (``argv``: the script's arguments, default
    ``sys.argv[1:]``)."""
    return ALLOW_REMOTE_PATHS in (sys.argv[1:] if argv is None else argv)
