"""ethtool over netlink: NIC coalescing, rings, channels, pause and features, spoken directly.

Never ethtool's text output (TuneD's `net` plugin parsed it and broke on new lines,
tuned#726, tuned#819). The keys are the kernel's netlink attributes
(include/uapi/linux/ethtool_netlink.h) under ethtool(8)'s names; the suite checks
these tables against the uapi header and against the running kernel's own policy
(`accepted_attributes`), so a kernel that grows a key fails a test, not a user.

Replies carry only what the driver supports: a key missing from a reply is "not
supported by this driver". Refusals become KernelRefused with the errno and the
kernel's own extended-ack message ("unsupported parameter").

This talks raw generic netlink: pyroute2's ethtool support imports all of pyroute2
(~230 ms and 23 MiB of RSS here), more than the rest of the daemon.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from latencyd.errors import KernelRefused, NotApplicable

# -- what a NIC can be asked, by ethtool(8)'s names ------------------------------------------


@dataclass(frozen=True)
class Key:
    """One netlink attribute: its ethtool(8) name, index and width (flags are u8 bools)."""

    name: str
    attr: int
    flag: bool = False  # u8 on/off, read and written as a bool


# ETHTOOL_A_COALESCE_*: index = position in the uapi enum (1 is the request header).
COALESCE = (
    Key("rx-usecs", 2),
    Key("rx-frames", 3),
    Key("rx-usecs-irq", 4),
    Key("rx-frames-irq", 5),
    Key("tx-usecs", 6),
    Key("tx-frames", 7),
    Key("tx-usecs-irq", 8),
    Key("tx-frames-irq", 9),
    Key("stats-block-usecs", 10),
    Key("adaptive-rx", 11, flag=True),
    Key("adaptive-tx", 12, flag=True),
    Key("pkt-rate-low", 13),
    Key("rx-usecs-low", 14),
    Key("rx-frames-low", 15),
    Key("tx-usecs-low", 16),
    Key("tx-frames-low", 17),
    Key("pkt-rate-high", 18),
    Key("rx-usecs-high", 19),
    Key("rx-frames-high", 20),
    Key("tx-usecs-high", 21),
    Key("tx-frames-high", 22),
    Key("sample-interval", 23),
    Key("cqe-mode-tx", 24, flag=True),
    Key("cqe-mode-rx", 25, flag=True),
    Key("tx-aggr-max-bytes", 26),
    Key("tx-aggr-max-frames", 27),
    Key("tx-aggr-time-usecs", 28),
)
# ETHTOOL_A_RINGS_*: the *_MAX attributes (2-5, 16, 18) are read-only limits.
RING = (
    Key("rx", 6),
    Key("rx-mini", 7),
    Key("rx-jumbo", 8),
    Key("tx", 9),
    Key("rx-buf-len", 10),
    Key("cqe-size", 12),
    Key("tx-push", 13, flag=True),
    Key("rx-push", 14, flag=True),
    Key("tx-push-buf-len", 15),
    Key("hds-thresh", 17),
)
# ETHTOOL_A_CHANNELS_*: 2-5 are the maxima.
CHANNELS = (Key("rx", 6), Key("tx", 7), Key("other", 8), Key("combined", 9))
# ETHTOOL_A_PAUSE_*: 5 and 6 are statistics.
PAUSE = (Key("autoneg", 2, flag=True), Key("rx", 3, flag=True), Key("tx", 4, flag=True))

# Attributes of the SET requests that are deliberately not offered as keys: the header,
# nested per-profile tables (ETHTOOL_A_COALESCE_RX/TX_PROFILE) and the tri-state
# tcp-data-split (ETHTOOL_A_RINGS_TCP_DATA_SPLIT), which needs a driver-specific reading.
NOT_OFFERED = {"coalesce": {1, 29, 30}, "ring": {1, 11}, "channels": {1}, "pause": {1}}


@dataclass(frozen=True)
class Group:
    name: str
    get: int  # ETHTOOL_MSG_*_GET
    set: int  # ETHTOOL_MSG_*_SET
    keys: tuple[Key, ...]

    def key(self, name: str) -> Key | None:
        return next((k for k in self.keys if k.name == name), None)


GROUPS = {
    g.name: g
    for g in (
        Group("ring", 15, 16, RING),
        Group("channels", 17, 18, CHANNELS),
        Group("coalesce", 19, 20, COALESCE),
        Group("pause", 21, 22, PAUSE),
    )
}
FEATURES_GET, FEATURES_SET = 11, 12

# ethtool(8)'s short feature names; each stands for the kernel features listed (the
# kernel's own names, e.g. "rx-gro", are accepted as they are).
FEATURE_ALIASES = {
    "rx": ("rx-checksum",),
    "tx": (
        "tx-checksum-ipv4",
        "tx-checksum-ip-generic",
        "tx-checksum-ipv6",
        "tx-checksum-fcoe-crc",
        "tx-checksum-sctp",
    ),
    "sg": ("tx-scatter-gather", "tx-scatter-gather-fraglist"),
    "tso": (
        "tx-tcp-segmentation",
        "tx-tcp-ecn-segmentation",
        "tx-tcp-mangleid-segmentation",
        "tx-tcp6-segmentation",
    ),
    "ufo": ("tx-udp-fragmentation",),
    "gso": ("tx-generic-segmentation",),
    "gro": ("rx-gro",),
    "lro": ("rx-lro",),
    "rxvlan": ("rx-vlan-hw-parse",),
    "txvlan": ("tx-vlan-hw-insert",),
    "ntuple": ("rx-ntuple-filter",),
    "rxhash": ("rx-hashing",),
}


@dataclass(frozen=True)
class Features:
    """A NIC's features by kernel name: which are on, and which the driver lets change."""

    active: frozenset[str]
    changeable: frozenset[str]
    known: frozenset[str]  # every feature name this kernel has


class Ethtool(Protocol):
    """What the System facade offers for NICs; NetlinkEthtool, or a fake in unit tests."""

    def read(self, ifname: str, group: str) -> dict[str, int | bool]: ...

    def write(self, ifname: str, group: str, key: str, value: int | bool) -> None: ...

    def features(self, ifname: str) -> Features: ...

    def set_feature(self, ifname: str, name: str, on: bool) -> None: ...

    def driver(self, ifname: str) -> str: ...


# -- generic netlink, the few pieces needed ---------------------------------------------------

NETLINK_GENERIC = 16
SOL_NETLINK = 270
NETLINK_CAP_ACK, NETLINK_EXT_ACK = 10, 11
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_ACK_TLVS = 0x200
NLMSGERR_ATTR_MSG = 1
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY, CTRL_CMD_GETPOLICY = 3, 10
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
CTRL_ATTR_POLICY, CTRL_ATTR_OP_POLICY, CTRL_ATTR_OP = 8, 9, 10
CTRL_ATTR_POLICY_DO = 1
HEADER_DEV_NAME = 2
HEADER_FLAGS = 3
FLAG_COMPACT_BITSETS, FLAG_OMIT_REPLY = 1, 2
STRSET_GET = 1
STRSET_STRINGSETS, STRINGSETS_STRINGSET = 2, 1
STRINGSET_ID, STRINGSET_STRINGS = 1, 3
STRING_INDEX, STRING_VALUE = 1, 2
ETH_SS_FEATURES = 4
BITSET_BITS, BITSET_VALUE = 3, 4
BITS_BIT = 1
BIT_NAME, BIT_VALUE = 2, 3
FEATURES_HW, FEATURES_WANTED, FEATURES_ACTIVE, FEATURES_NOCHANGE = 2, 3, 4, 5

SIOCETHTOOL, ETHTOOL_GDRVINFO = 0x8946, 0x00000003
DRVINFO_SIZE = 196  # struct ethtool_drvinfo

_NLMSG = struct.Struct("=IHHII")
_GENL = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")


def nla(kind: int, payload: bytes) -> bytes:
    head = _NLA.pack(_NLA.size + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def nla_u32(kind: int, value: int) -> bytes:
    return nla(kind, struct.pack("=I", value))


def nla_str(kind: int, value: str) -> bytes:
    return nla(kind, value.encode() + b"\0")


def nla_nest(kind: int, *children: bytes) -> bytes:
    return nla(kind | NLA_F_NESTED, b"".join(children))


def attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute in `data`."""
    offset = 0
    while offset + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, offset)
        if length < _NLA.size:
            return
        yield kind & NLA_TYPE_MASK, data[offset + _NLA.size : offset + length]
        offset += (length + 3) & ~3


def attr_map(data: bytes) -> dict[int, bytes]:
    return dict(attrs(data))


def _errno_text(code: int) -> str:
    name = errno.errorcode.get(code, "")
    return f"{os.strerror(code)} ({name})" if name else os.strerror(code)


class NetlinkEthtool:
    """The kernel's ethtool generic-netlink family, on one socket opened when first used."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.family = 0
        self.seq = 0
        self._feature_names: tuple[str, ...] | None = None
        self._known_features: frozenset[str] = frozenset()

    # -- transport ---------------------------------------------------------------------
    def _socket(self) -> socket.socket:
        if self.sock is None:
            sock = socket.socket(
                socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC
            )
            sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            sock.bind((0, 0))
            self.sock = sock
            self.family = self._family_id("ethtool")
        return self.sock

    def _request(self, family: int, cmd: int, payload: bytes, dump: bool = False) -> list[bytes]:
        """Send one request; the attribute payloads of the replies (ACK checked)."""
        sock = self._socket()
        self.seq += 1
        flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_DUMP if dump else 0)
        body = _GENL.pack(cmd, 1, 0) + payload
        sock.send(_NLMSG.pack(_NLMSG.size + len(body), family, flags, self.seq, 0) + body)
        replies: list[bytes] = []
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, msg_flags, seq, _ = _NLMSG.unpack_from(data, offset)
                message = data[offset + _NLMSG.size : offset + length]
                offset += (length + 3) & ~3
                if seq != self.seq:
                    continue
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", message)[0]
                    if code == 0:
                        if not dump:
                            return replies
                        continue
                    raise OSError(code, self._ext_ack(message, msg_flags) or _errno_text(code))
                if kind == NLMSG_DONE:
                    return replies
                replies.append(message[_GENL.size :])

    @staticmethod
    def _ext_ack(message: bytes, flags: int) -> str:
        """The kernel's extended-ack text ("unsupported parameter"), if it sent one."""
        if not flags & NLM_F_ACK_TLVS:
            return ""
        tlvs = attr_map(message[4 + _NLMSG.size :])  # error code, then the capped header
        text = tlvs.get(NLMSGERR_ATTR_MSG, b"").rstrip(b"\0").decode(errors="replace")
        code = -struct.unpack_from("=i", message)[0]
        return f"{text}: {_errno_text(code)}" if text else ""

    def _family_id(self, name: str) -> int:
        assert self.sock is not None
        self.seq += 1
        body = _GENL.pack(CTRL_CMD_GETFAMILY, 1, 0) + nla_str(CTRL_ATTR_FAMILY_NAME, name)
        self.sock.send(
            _NLMSG.pack(_NLMSG.size + len(body), GENL_ID_CTRL, NLM_F_REQUEST, self.seq, 0) + body
        )
        data = self.sock.recv(65536)
        length, kind, _, _, _ = _NLMSG.unpack_from(data)
        message = data[_NLMSG.size : length]
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", message)[0]
            raise OSError(code, f"no ethtool netlink family: {_errno_text(code)}")
        found = attr_map(message[_GENL.size :]).get(CTRL_ATTR_FAMILY_ID)
        if found is None:
            raise OSError(errno.ENOENT, "no ethtool netlink family")
        return int(struct.unpack("=H", found[:2])[0])

    def _call(self, what: str, cmd: int, payload: bytes) -> list[bytes]:
        try:
            self._socket()
            return self._request(self.family, cmd, payload)
        except OSError as exc:
            raise KernelRefused(what, exc.strerror or str(exc)) from exc

    @staticmethod
    def _header(ifname: str, flags: int = 0) -> bytes:
        parts = [nla_str(HEADER_DEV_NAME, ifname)]
        if flags:
            parts.append(nla_u32(HEADER_FLAGS, flags))
        return nla_nest(1, *parts)

    # -- the Ethtool interface -------------------------------------------------------------
    def read(self, ifname: str, group: str) -> dict[str, int | bool]:
        g = GROUPS[group]
        replies = self._call(f"reading {ifname} {group}", g.get, self._header(ifname))
        found = attr_map(replies[0]) if replies else {}
        out: dict[str, int | bool] = {}
        for key in g.keys:
            raw = found.get(key.attr)
            if raw is not None:
                out[key.name] = bool(raw[0]) if key.flag else int(struct.unpack("=I", raw[:4])[0])
        return out

    def write(self, ifname: str, group: str, key: str, value: int | bool) -> None:
        g = GROUPS[group]
        k = g.key(key)
        if k is None:
            raise NotApplicable(f"{group} has no key {key!r}")
        payload = struct.pack("=B", int(value)) if k.flag else struct.pack("=I", int(value))
        self._call(
            f"setting {ifname} {group} {key} = {value}",
            g.set,
            self._header(ifname, FLAG_OMIT_REPLY) + nla(k.attr, payload),
        )

    def feature_names(self) -> tuple[str, ...]:
        """The kernel's NIC feature names by bit (ETH_SS_FEATURES; global, read once)."""
        if self._feature_names is None:
            # The strings are global: an empty header (no device) asks for them.
            wanted = nla_nest(STRINGSETS_STRINGSET, nla_u32(STRINGSET_ID, ETH_SS_FEATURES))
            request = nla_nest(1) + nla_nest(STRSET_STRINGSETS, wanted)
            replies = self._call("reading the kernel's NIC feature names", STRSET_GET, request)
            names: dict[int, str] = {}
            for reply in replies:
                for _, stringset in attrs(attr_map(reply).get(STRSET_STRINGSETS, b"")):
                    strings = attr_map(stringset).get(STRINGSET_STRINGS, b"")
                    for _, string in attrs(strings):
                        fields = attr_map(string)
                        index = int(struct.unpack("=I", fields[STRING_INDEX][:4])[0])
                        names[index] = fields.get(STRING_VALUE, b"").rstrip(b"\0").decode()
            self._feature_names = tuple(names.get(i, "") for i in range(max(names, default=-1) + 1))
            self._known_features = frozenset(n for n in self._feature_names if n)
        return self._feature_names

    def features(self, ifname: str) -> Features:
        request = self._header(ifname, FLAG_COMPACT_BITSETS)
        replies = self._call(f"reading {ifname} features", FEATURES_GET, request)
        found = attr_map(replies[0]) if replies else {}
        names = self.feature_names()

        def bits(kind: int) -> frozenset[str]:
            raw = attr_map(found.get(kind, b"")).get(BITSET_VALUE, b"")
            value, set_bits = int.from_bytes(raw, "little"), []
            while value:  # the set bits only: a NIC has a few of the kernel's ~60 features
                low = value & -value
                set_bits.append(low.bit_length() - 1)
                value ^= low
            return frozenset(names[i] for i in set_bits if i < len(names) and names[i])

        changeable = bits(FEATURES_HW) - bits(FEATURES_NOCHANGE)
        return Features(bits(FEATURES_ACTIVE), changeable, self._known_features)

    def set_feature(self, ifname: str, name: str, on: bool) -> None:
        bit = nla_nest(BITS_BIT, nla_str(BIT_NAME, name), *([nla(BIT_VALUE, b"")] if on else []))
        wanted = nla_nest(FEATURES_WANTED, nla_nest(BITSET_BITS, bit))
        self._call(
            f"setting {ifname} feature {name} {'on' if on else 'off'}",
            FEATURES_SET,
            self._header(ifname, FLAG_OMIT_REPLY) + wanted,
        )

    def driver(self, ifname: str) -> str:
        """The NIC's driver name (ETHTOOL_GDRVINFO: ethtool netlink has no such request);
        "" if the driver does not say."""
        info = bytearray(struct.pack("=I", ETHTOOL_GDRVINFO) + bytes(DRVINFO_SIZE - 4))
        buf = (ctypes.c_char * len(info)).from_buffer(info)
        ifreq = struct.pack("16sP", ifname.encode()[:15], ctypes.addressof(buf))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
        except OSError:
            return ""
        return bytes(info[4:36]).split(b"\0", 1)[0].decode(errors="replace")

    # -- what this kernel accepts --------------------------------------------------------
    def accepted_attributes(self, cmd: int) -> set[int]:
        """Attribute indices the running kernel's policy accepts for an ethtool command."""
        self._socket()
        payload = nla(CTRL_ATTR_FAMILY_ID, struct.pack("=H", self.family)) + nla_u32(
            CTRL_ATTR_OP, cmd
        )
        replies = self._request(GENL_ID_CTRL, CTRL_CMD_GETPOLICY, payload, dump=True)
        do_policy = None
        policies: dict[int, set[int]] = {}
        for reply in replies:
            top = attr_map(reply)
            for _, op in attrs(top.get(CTRL_ATTR_OP_POLICY, b"")):
                raw = attr_map(op).get(CTRL_ATTR_POLICY_DO)
                if raw is not None:
                    do_policy = int(struct.unpack("=I", raw[:4])[0])
            for index, policy in attrs(top.get(CTRL_ATTR_POLICY, b"")):
                policies.setdefault(index, set()).update(k for k, _ in attrs(policy))
        return policies.get(do_policy, set()) if do_policy is not None else set()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
