"""TFRecord files from Python: written by tf.io.TFRecordWriter and read back, and written by a
second, independent path (this file's own framing: struct and a bitwise CRC-32C) and read
by tf.data.TFRecordDataset; a flipped bit is an error naming the file, record and offset."""
import struct

import pytest

import dtrain as tf


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
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked(crc32c(length))) + record + struct.pack("<I", masked(crc32c(record)))


RECORDS = [b"", b"hello", bytes(range(256)) * 3, "\u00e9t\u00e9".encode()]


def test_records_written_here_read_back_as_written_elsewhere(tmp_path):
    assert tf.data._data.crc32c(b"123456789") == 0xE3069283 == crc32c(b"123456789")
    mine = tmp_path / "mine.tfrecord"
    with tf.io.TFRecordWriter(str(mine)) as writer:
        for r in RECORDS:
            writer.write(r)
    assert mine.read_bytes() == b"".join(framed(r) for r in RECORDS)
    theirs = tmp_path / "theirs.tfrecord"
    theirs.write_bytes(b"".join(framed(r) for r in reversed(RECORDS)))
    read = [t.numpy() for t in tf.data.TFRecordDataset([str(mine), str(theirs)])]
    assert read == RECORDS + list(reversed(RECORDS))


def test_a_flipped_bit_names_the_file_the_record_and_its_offset(tmp_path):
    data = bytearray(b"".join(framed(r) for r in RECORDS))
    second = len(framed(RECORDS[0]))
    data[second + 12 + 2] ^= 0x10  # inside the second record's bytes
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    with pytest.raises(Exception, match=f"{bad}: corrupt record at offset {second} \\(record 1\\)"):
        list(tf.data.TFRecordDataset(str(bad)))
    with pytest.raises(ValueError, match="uncompressed"):
        tf.data.TFRecordDataset(str(bad), compression_type="GZIP")
