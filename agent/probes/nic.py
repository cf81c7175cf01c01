"""NIC throughput from kernel counters: ``/sys/class/net/<if>/statistics/{rx,tx}_bytes``, EFA /
InfiniBand port counters (``port_{rcv,xmit}_data``, in 4-byte words) when present, link state,
and the namespace's TCP retransmissions (``/proc/net/snmp``) that tell a sick network from a
stopped peer.

``sys_root`` and ``proc_root`` are injectable so tests can drive the counters.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.ring import Ring


def _read_int(path: Path, base: int = 10) -> int | None:
    try:
        with open(path, "rb") as f:
            return int(f.read().strip() or 0, base)
    except (OSError, ValueError):
        return None


def _read_str(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


def default_interfaces(sys_root: Path = Path("/sys")) -> list[str]:
    """Every non-loopback interface that is up (``lo`` only when asked for by name)."""
    net = sys_root / "class" / "net"
    try:
        names = sorted(os.listdir(net))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name == "lo":
            continue
        flags = _read_int(net / name / "flags", 16)  # IFF_UP = 0x1; operstate lies for some virtual links
        if (flags is not None and flags & 1) or _read_str(net / name / "operstate") == "up":
            out.append(name)
    return out


def interfaces_from_resourceconfig(path: Path) -> list[str] | None:
    try:
        name = json.loads(Path(path).read_text()).get("network_interface_name")
    except (OSError, ValueError, AttributeError):
        return None
    if not name:
        return None
    return [n.strip() for n in name.split(",") if n.strip()] if isinstance(name, str) else list(name)


class NicProbe:
    """Per interface (and IB/EFA port) ``{"rx_bps", "tx_bps"}`` samples in a ring."""

    def __init__(
        self,
        interfaces: list[str] | None = None,
        sys_root: Path | str = "/sys",
        proc_root: Path | str = "/proc",
        maxlen: int = 600,
    ):
        self.sys_root, self.proc_root = Path(sys_root), Path(proc_root)
        # Names that do not exist here (a resourceconfig written for another image) fall back
        # to every up interface rather than watching nothing.
        asked = [n for n in interfaces or [] if (self.sys_root / "class" / "net" / n).exists()]
        self.missing = [n for n in interfaces or [] if n not in asked]
        self.interfaces = asked or default_interfaces(self.sys_root)
        self.maxlen = maxlen
        self._counters = self._counter_paths()
        self._prev: dict[str, tuple[float, int, int]] = {}
        self.rings: dict[str, Ring] = {name: Ring(maxlen) for name in self._counters}
        self.state: dict[str, str] = {}
        self.retrans = Ring(maxlen)

    def _counter_paths(self) -> dict[str, tuple[list[Path], list[Path], int, Path | None]]:
        """name -> (rx paths, tx paths, bytes per unit, operstate path)."""
        out: dict = {}
        net = self.sys_root / "class" / "net"
        for name in self.interfaces:
            st = net / name / "statistics"
            out[name] = ([st / "rx_bytes"], [st / "tx_bytes"], 1, net / name / "operstate")
        ib = self.sys_root / "class" / "infiniband"
        if ib.is_dir():
            for dev in sorted(os.listdir(ib)):
                ports = ib / dev / "ports"
                for port in sorted(os.listdir(ports)) if ports.is_dir() else []:
                    c = ports / port / "counters"
                    if (c / "port_rcv_data").exists():
                        out[f"{dev}/{port}"] = (
                            [c / "port_rcv_data"],
                            [c / "port_xmit_data"],
                            4,
                            ports / port / "state",
                        )
        return out

    def _tcp_retrans(self) -> int | None:
        try:
            lines = [
                ln.split() for ln in (self.proc_root / "net" / "snmp").read_text().splitlines() if ln.startswith("Tcp:")
            ]
            return int(lines[1][lines[0].index("RetransSegs")])
        except (OSError, IndexError, ValueError):
            return None

    def sample(self, now: float) -> dict[str, dict]:
        """Rates since the previous sample; the first sample of an interface only primes it."""
        rates: dict[str, dict] = {}
        for name, (rx_paths, tx_paths, unit, state_path) in self._counters.items():
            rx = sum(_read_int(p) or 0 for p in rx_paths) * unit
            tx = sum(_read_int(p) or 0 for p in tx_paths) * unit
            state = _read_str(state_path) if state_path else "unknown"
            # IB port state reads like "4: ACTIVE"
            self.state[name] = state.split(":")[-1].strip().lower().replace("active", "up")
            prev = self._prev.get(name)
            self._prev[name] = (now, rx, tx)
            if prev is None or now <= prev[0]:
                continue
            dt = now - prev[0]
            value = {"rx_bps": max(0, rx - prev[1]) / dt, "tx_bps": max(0, tx - prev[2]) / dt}
            self.rings[name].append(now, value)
            rates[name] = value
        r = self._tcp_retrans()
        if r is not None:
            self.retrans.append(now, r)
        return rates
