"""The tests' own protobuf wire format and TFRecord framing, a second path beside dtrain's
(also fuzz/make_seeds.py's): a message's fields as (number, value) pairs (varints as ints,
the rest as bytes), fields written, and records framed with a bitwise CRC-32C."""
import struct


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def framed(record):
    """One TFRecord: [u64 length][masked CRC-32C of it][bytes][masked CRC-32C of them]."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked(crc32c(length))) + record + struct.pack("<I", masked(crc32c(record)))


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def field(number, payload):
    """A length-delimited field: tag, length, bytes."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _varint(message, at):
    value, shift = 0, 0
    while True:
        b = message[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at


def fields(message):
    out, at = [], 0
    while at < len(message):
        key, at = _varint(message, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = _varint(message, at)
        elif kind == 1:
            value, at = message[at:at + 8], at + 8
        elif kind == 5:
            value, at = message[at:at + 4], at + 4
        else:
            length, at = _varint(message, at)
            value, at = message[at:at + length], at + length
        out.append((number, value))
    return out
