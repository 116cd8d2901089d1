"""Go's ``net.Listen("tcp", addr)``, as Koordinator's koordlet serves ``-addr`` (``http.ListenAndServe``).

The address forms Go takes and its errors for the others (``net.SplitHostPort``, ``LookupPort``), and the socket
Go opens for each:

- ``:9316``, ``0.0.0.0:9316`` and ``[::]:9316`` (a wildcard host) listen on IPv4 and IPv6 at once: an AF_INET6
  socket with ``IPV6_V6ONLY=0`` bound to ``::``, where the kernel maps IPv4 onto IPv6 sockets or has no IPv4. Where
  it does not map (a kernel without IPv6: ``socket(AF_INET6)`` fails), ``:9316`` and ``0.0.0.0:9316`` take an
  AF_INET socket on ``0.0.0.0``. Go decides this by the same two probes (``probeIPv6Stack``, ``favoriteAddrFamily``);
- ``127.0.0.1:9316`` AF_INET; ``[::1]:9316`` and ``[fe80::1%eth0]:9316`` AF_INET6 (an IPv4-mapped literal such as
  ``[::ffff:127.0.0.1]:9316`` is IPv4 to Go); a host name is resolved and its first IPv4 address taken, else its
  first address;
- the port is decimal (``+80`` too), empty (port 0: any free one), or a service name (``http``, looked up in
  ``/etc/services``, case-insensitively, Go's built-in table beside it).

Errors carry Go's text (``address 9316: missing port in address``, ``address 70000: invalid port``, ``lookup
tcp/nope: unknown port``, ``listen tcp [::1]:9316: bind: address already in use``).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from dataclasses import dataclass

# Go's net package answers these names without the services file (lookup.go's ``services`` map).
_GO_SERVICES = {"ftp": 21, "ftps": 990, "gopher": 70, "http": 80, "https": 443, "imap2": 143, "imap3": 220,
                "imaps": 993, "pop3": 110, "pop3s": 995, "smtp": 25, "submissions": 465, "ssh": 22, "telnet": 23}
_CUTOFF = 1 << 30  # parsePort saturates beyond it; the range check then refuses the value


class AddrError(ValueError):
    """An address Go's net package refuses; the message is Go's ``AddrError``/``DNSError`` text."""


class ListenError(OSError):
    """A socket that could not be opened or bound; its text is Go's (``listen tcp [::1]:9316: bind: address already
    in use``), its ``errno`` the kernel's."""

    def __str__(self) -> str:
        return str(self.strerror)


def _addr_error(addr: str, why: str) -> AddrError:
    return AddrError(f"address {addr}: {why}" if addr else why)


def split_host_port(hostport: str) -> tuple[str, str]:
    """``net.SplitHostPort``: ``host:port``, ``[host]:port`` or ``[host%zone]:port`` into host and port."""
    missing_port, too_many_colons = "missing port in address", "too many colons in address"
    i = hostport.rfind(":")
    if i < 0:
        raise _addr_error(hostport, missing_port)
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise _addr_error(hostport, "missing ']' in address")
        if end + 1 == len(hostport):
            raise _addr_error(hostport, missing_port)
        if end + 1 != i:
            raise _addr_error(hostport, too_many_colons if hostport[end + 1] == ":" else missing_port)
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            raise _addr_error(hostport, too_many_colons)
    if "[" in hostport[j:]:
        raise _addr_error(hostport, "unexpected '[' in address")
    if "]" in hostport[k:]:
        raise _addr_error(hostport, "unexpected ']' in address")
    return host, hostport[i + 1:]


def _parse_port(service: str) -> int | None:
    """Go's ``parsePort``: the number, or None when ``service`` is a name to look up."""
    if service == "":
        return 0  # Go's legacy rule (golang.org/issue/13610): an empty port is port 0
    negative, digits = service[0] == "-", service[1:] if service[0] in "+-" else service
    if digits == "" or not all("0" <= c <= "9" for c in digits):
        return None if digits or service[0] not in "+-" else 0
    value = min(int(digits), _CUTOFF)
    return -value if negative else min(value, _CUTOFF - 1)


def lookup_port(service: str) -> int:
    """``net.LookupPort("tcp", service)``: a decimal port, or a service name from Go's table or /etc/services."""
    port = _parse_port(service)
    if port is None:
        name = service.lower()
        port = _GO_SERVICES.get(name)
        if port is None:
            try:
                port = socket.getservbyname(name, "tcp")
            except OSError:
                raise AddrError(f"lookup tcp/{service}: unknown port") from None
    if not 0 <= port <= 65535:
        raise _addr_error(service, "invalid port")
    return port


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """``-addr`` as Go reads it: the host as written (no brackets; empty for ``:port``) and the port number."""

    host: str
    port: int

    @property
    def wildcard(self) -> bool:
        """Every address (``""``, ``0.0.0.0``, ``::``): Go's ``isWildcard``."""
        if not self.host:
            return True
        try:
            return ipaddress.ip_address(self.host).is_unspecified
        except ValueError:
            return False


def parse_listen_address(addr: str) -> ListenAddress:
    """``addr`` split and its port looked up as ``net.Listen`` does before it opens a socket."""
    host, port = split_host_port(addr)
    return ListenAddress(host, lookup_port(port))


@functools.cache
def stack() -> tuple[bool, bool]:
    """(IPv4 sockets, IPv4-mapped IPv6 sockets) on this host, probed as Go's ``probeIPv4Stack`` and
    ``probeIPv6Stack`` do: an AF_INET socket, and an AF_INET6 socket with ``IPV6_V6ONLY=0`` bound to
    ``::ffff:127.0.0.1``."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        ipv4 = True
    except OSError:
        ipv4 = False
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return ipv4, False
    with probe:
        try:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            probe.bind(("::ffff:127.0.0.1", 0))
        except OSError:
            return ipv4, False
    return ipv4, True


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None


def _family_and_host(address: ListenAddress) -> tuple[socket.AddressFamily, str]:
    """Go's ``favoriteAddrFamily`` for a listener, and the host to bind."""
    if address.wildcard:
        ipv4, ipv4_mapped = stack()
        if ipv4_mapped or not ipv4:
            return socket.AF_INET6, "::"
        return (socket.AF_INET6, "::") if ":" in address.host else (socket.AF_INET, "0.0.0.0")  # noqa: S104
    literal = _literal(address.host)
    if literal is None:
        return _resolved(address)
    mapped = getattr(literal, "ipv4_mapped", None)
    if literal.version == 6 and mapped is None:
        return socket.AF_INET6, address.host
    return socket.AF_INET, str(mapped or literal)  # an IPv4-mapped address is IPv4 to Go (IP.To4)


def _resolved(address: ListenAddress) -> tuple[socket.AddressFamily, str]:
    """A host name: its first IPv4 address, else its first one (Go's ``addrList.first(isIPv4)``)."""
    try:
        found = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise AddrError(f"lookup {address.host}: no such host") from None
    ipv4 = [entry for entry in found if entry[0] == socket.AF_INET]
    family, _, _, _, sockaddr = (ipv4 or found)[0]
    return socket.AddressFamily(family), str(sockaddr[0])


def listen(address: ListenAddress, backlog: int = 128) -> socket.socket:
    """A listening TCP socket for ``address``, opened as Go's ``net.Listen("tcp", ...)`` opens it (SO_REUSEADDR,
    ``IPV6_V6ONLY=0`` on an AF_INET6 socket); :class:`ListenError` when it cannot be, :class:`AddrError` for a host
    name that does not resolve."""
    family, host = _family_and_host(address)
    named = address.host if address.wildcard else host
    shown = f"[{named}]" if ":" in named else named
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise ListenError(err.errno, f"listen tcp {shown}:{address.port}: socket: {_go_errno(err)}") from err
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        target = socket.getaddrinfo(host, address.port, family, socket.SOCK_STREAM)[0][4]
        sock.bind(target)
        sock.listen(backlog)
    except OSError as err:
        sock.close()
        raise ListenError(err.errno, f"listen tcp {shown}:{address.port}: bind: {_go_errno(err)}") from err
    return sock


def _go_errno(err: OSError) -> str:
    """The errno's text as Go's syscall package spells it (lower case: ``address already in use``)."""
    text = os.strerror(err.errno) if err.errno else str(err)
    return text[:1].lower() + text[1:]


def client_host(address: str) -> str:
    """A peer's address as Go's ``RemoteAddr`` shows it: an IPv4 client of a dual-stack socket
    (``::ffff:127.0.0.1``) as the IPv4 address it is."""
    literal = _literal(address)
    mapped = getattr(literal, "ipv4_mapped", None)
    return str(mapped) if mapped is not None else address
