"""TFRecord files from Python: written by tf.io.TFRecordWriter and read back, and written by a
second, independent path (the tests' own framing, wire.py: struct and a bitwise CRC-32C) and read
by tf.data.TFRecordDataset; a flipped bit is an error naming the file, record and offset."""
import gzip
import struct
import zlib

import numpy as np
import pytest

import dtrain as tf
from wire import crc32c, field, framed, varint


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
    with pytest.raises(Exception, match="compression_type 'LZ4' is not one TensorFlow names"):
        tf.data.TFRecordDataset(str(bad), compression_type="LZ4")
    with pytest.raises(Exception, match=f"{bad}: record 0 \\(at offset 0 of the inflated data\\): the compressed data is corrupt"):
        list(tf.data.TFRecordDataset(str(bad), compression_type="GZIP"))


def test_compressed_files_are_zlib_and_gzip_streams_of_the_framed_records(tmp_path):
    plain = b"".join(framed(r) for r in RECORDS * 20)
    for options, decompress in (("GZIP", gzip.decompress), (tf.io.TFRecordOptions(compression_type="ZLIB", compression_level=9),
                                                            zlib.decompress)):
        path = tmp_path / "mine.z"
        with tf.io.TFRecordWriter(str(path), options) as writer:
            for r in RECORDS * 20:
                writer.write(r)
        assert decompress(path.read_bytes()) == plain
        kind = options if isinstance(options, str) else options.compression_type
        assert [t.numpy() for t in tf.data.TFRecordDataset(str(path), compression_type=kind)] == RECORDS * 20
    # Compressed elsewhere (Python's gzip and zlib), read here.
    (tmp_path / "theirs.gz").write_bytes(gzip.compress(plain))
    (tmp_path / "theirs.zz").write_bytes(zlib.compress(plain))
    assert len(list(tf.data.TFRecordDataset(str(tmp_path / "theirs.gz"), "GZIP"))) == len(RECORDS) * 20
    assert len(list(tf.data.TFRecordDataset(str(tmp_path / "theirs.zz"), "ZLIB"))) == len(RECORDS) * 20


# ---- tf.train.Example, by a second path: protobuf's wire format spelled out here.

def example_bytes(features):
    """Example{features{feature{key, value}}} for {key: ("floats"|"ints"|"bytes", values)},
    keys in order, lists packed: as TensorFlow's deterministic serialization writes it."""
    entries = b""
    for key in sorted(features):
        kind, values = features[key]
        if kind == "floats":
            feature = field(2, field(1, struct.pack(f"<{len(values)}f", *values)) if values else b"")
        elif kind == "ints":
            feature = field(3, field(1, b"".join(varint(v) for v in values)) if values else b"")
        else:
            feature = field(1, b"".join(field(1, v) for v in values))
        entries += field(1, field(1, key.encode()) + field(2, feature))
    return field(1, entries)


def test_examples_are_protobuf_bytes_both_ways():
    features = {"image": ("floats", [0.5, -1.25, 3.0]), "label": ("ints", [7, -3]), "name": ("bytes", [b"shirt", b""])}
    example = tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[7, -3])),
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, -1.25, 3.0])),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"shirt", b""])),
    }))
    assert example.SerializeToString() == example_bytes(features)
    back = tf.train.Example.FromString(example_bytes(features))
    assert back == example
    assert back.features.feature["label"].int64_list.value == [7, -3]
    assert back.features.feature["image"].WhichOneof("kind") == "float_list"


def test_parsing_against_a_spec(tmp_path):
    path = tmp_path / "ex.tfrecord"
    rows = [{"x": ("floats", [float(i), float(i) + 0.5]), "y": ("ints", [i]), "tags": ("bytes", [b"t"] * i),
             "seq": ("ints", list(range(2 * i)))} for i in range(4)]
    path.write_bytes(b"".join(framed(example_bytes(r)) for r in rows))
    spec = {"x": tf.io.FixedLenFeature([2], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64),
            "tags": tf.io.VarLenFeature(tf.string),
            "seq": tf.io.FixedLenSequenceFeature([2], tf.int64, allow_missing=True),
            "w": tf.io.FixedLenFeature([], tf.float32, default_value=1.0)}
    one = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert [float(e["x"].numpy()[1]) for e in one] == [0.5, 1.5, 2.5, 3.5]
    assert [e["seq"].numpy().shape for e in one] == [(0, 2), (1, 2), (2, 2), (3, 2)]
    assert isinstance(one[2]["tags"], tf.SparseTensor) and one[2]["tags"].shape == (2,)
    assert float(one[0]["w"].numpy()) == 1.0
    batch = next(iter(tf.data.TFRecordDataset(str(path)).batch(4).map(lambda b: tf.io.parse_example(b, spec))))
    assert batch["x"].numpy().shape == (4, 2) and list(batch["y"].numpy()) == [0, 1, 2, 3]
    assert batch["seq"].numpy().shape == (4, 3, 2) and batch["seq"].numpy()[1].tolist() == [[0, 1], [0, 0], [0, 0]]
    dense = tf.sparse.to_dense(batch["tags"]).numpy()
    assert dense.shape == (4, 3) and dense[3].tolist() == [b"t", b"t", b"t"] and dense[1].tolist() == [b"t", b"", b""]
    with pytest.raises(Exception, match="parse_example: example 0: feature 'z' \\(float32\\) is required"):
        tf.io.parse_example(batch_of(path), {"z": tf.io.FixedLenFeature([], tf.float32)})
    with pytest.raises(Exception, match="feature 'x' has 2 values where its shape \\[3\\] holds 3"):
        tf.io.parse_example(batch_of(path), {"x": tf.io.FixedLenFeature([3], tf.float32)})


def batch_of(path):
    return next(iter(tf.data.TFRecordDataset(str(path)).batch(4)))


def test_tensors_as_bytes():
    t = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    proto = tf.io.serialize_tensor(t)
    # dtype 1 (float), shape [2, 2], tensor_content: as TensorFlow writes it.
    assert proto.numpy() == (b"\x08\x01" + field(2, field(2, b"\x08\x02") * 2) +
                             field(4, struct.pack("<4f", 1, 2, 3, 4)))
    assert tf.io.parse_tensor(proto, tf.float32).numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    raw = tf.io.decode_raw(tf.constant([np.arange(6, dtype=np.uint8).tobytes()] * 2), tf.uint8)
    assert raw.numpy().shape == (2, 6) and raw.numpy()[1, 5] == 5
    doubles = tf.io.decode_raw(np.array([1.5, -2.0]).tobytes(), tf.float64)
    assert doubles.numpy().tolist() == [1.5, -2.0]
    big = tf.io.decode_raw(struct.pack(">2i", 1, -2), tf.int32, little_endian=False)
    assert big.numpy().tolist() == [1, -2]
