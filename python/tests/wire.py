"""The tests' own reader of protobuf's wire format, a second path beside dtrain's: a
message's fields as (number, value) pairs (varints as ints, the rest as bytes)."""


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
