#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora under fuzz/corpus/: small valid inputs of each
format and a few near-valid ones (truncated, oversized claims), from which libFuzzer
mutates. Rerun after changing a format; the files are committed."""
import gzip
import json
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx(dims, values):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(values)


# ---- IDX
labels = idx([6], [0, 1, 2, 9, 3, 1])
images = idx([2, 3, 2], range(0, 240, 20))
put("fuzz_idx", "labels", labels)
put("fuzz_idx", "images", images)
put("fuzz_idx", "labels.gz", gzip.compress(labels, mtime=0))
put("fuzz_idx", "images.gz", gzip.compress(images, mtime=0))
put("fuzz_idx", "truncated", images[:-3])
put("fuzz_idx", "huge-dims", idx([60000, 4096, 51200], [7] * 100))
put("fuzz_idx", "label-out-of-range", idx([3], [1, 200, 2]))

# ---- CSV: the first byte picks the options (1 header, 2 ';', 4 non-finite allowed,
# 8 a label column, 16 select columns); the rest is the file.
put("fuzz_csv", "header-label", b"\x09" + b"a,b,label\n1,2,0\n3.5, 4 ,1\n\n5,6,1\n")
put("fuzz_csv", "no-header", b"\x08" + b"0,1.5,2\n1,2.5,3e-3\n")
put("fuzz_csv", "semicolons-select", b"\x1b" + b"a;1;2;label\n1;2;3;0\n4;5;6;1\n")
put("fuzz_csv", "non-finite", b"\x0d" + b"a,label\nnan,1\ninf,-inf\n")
put("fuzz_csv", "ragged", b"\x01" + b"a,b\n1,2\n3\n")


# ---- records: [u64 length][u32 crc of it][bytes][u32 crc of them], each holding
# [u64 count] then per tensor [u64 dtype][u64 rank][u64 extents...][bytes].
def u64(v):
    return struct.pack("<Q", v)


def tensor(dtype, dims, payload):
    return u64(dtype) + u64(len(dims)) + b"".join(u64(d) for d in dims) + payload


def element(*tensors):
    return u64(len(tensors)) + b"".join(tensors)


def record(body):
    head = u64(len(body))
    return head + struct.pack("<I", zlib.crc32(head)) + body + struct.pack("<I", zlib.crc32(body))


F32, BF16, I32, U8 = 0, 1, 2, 3
row = element(tensor(F32, [4], struct.pack("<4f", 1, 2, 3, 4)), tensor(I32, [], struct.pack("<i", 1)))
put("fuzz_records", "two-records", record(row) + record(element(tensor(U8, [2, 3], bytes(range(6))))))
put("fuzz_records", "bf16-and-empty", record(element(tensor(BF16, [2], b"\x80\x3f\x00\x40"), tensor(F32, [0, 5], b""))))
put("fuzz_records", "element-bytes", row)
put("fuzz_records", "truncated", record(row)[:-5])
# An iterator state: magic "DTIS", then values, tensors and children, each counted.
state = u64(0x44544953) + u64(2) + u64(1) + u64(7) + u64(1) + tensor(I32, [1], struct.pack("<i", 5)) + u64(1)
state += u64(0) + u64(0) + u64(0)
put("fuzz_records", "iterator-state", state)


# TFRecord files (TensorFlow's framing): the same layout, each checksum a masked CRC-32C,
# framed by the Python tests' own writer.
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
from wire import framed as tfrecord  # noqa: E402

put("fuzz_records", "tfrecord", tfrecord(b"") + tfrecord(row))
# A tf.train.Example (x: floats [1, 2], y: int64 [3], z: bytes ["ab"]), framed and gzipped,
# and a TensorProto (float32 [[1, 2]]), as TensorFlow writes them.
from wire import field, varint  # noqa: E402

example = field(1, field(1, field(1, b"x") + field(2, field(2, field(1, struct.pack("<2f", 1, 2))))) +
                   field(1, field(1, b"y") + field(2, field(3, field(1, varint(3))))) +
                   field(1, field(1, b"z") + field(2, field(1, field(1, b"ab")))))
put("fuzz_records", "example", example)
put("fuzz_records", "tfrecord-gzip", gzip.compress(tfrecord(example), mtime=0))
put("fuzz_records", "tensor-proto", b"\x08\x01" + field(2, field(2, b"\x08\x01") + field(2, b"\x08\x02")) +
    field(4, struct.pack("<2f", 1, 2)))


# ---- safetensors: [u64 header length][JSON header][data]
def safetensors(entries, data, metadata=None):
    header = dict(entries)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return u64(len(text)) + text + data


w = struct.pack("<6f", *range(6))
put("fuzz_safetensors", "two-tensors", safetensors(
    {"dense/kernel": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
     "step": {"dtype": "I32", "shape": [], "data_offsets": [24, 28]}}, w + struct.pack("<i", 3), {"format": "pt"}))
put("fuzz_safetensors", "bf16-u8", safetensors(
    {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
     "b": {"dtype": "U8", "shape": [3, 1], "data_offsets": [4, 7]}}, b"\x80\x3f\x00\x40\x01\x02\x03"))
put("fuzz_safetensors", "empty", safetensors({}, b""))
put("fuzz_safetensors", "offsets-past-end", safetensors(
    {"a": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}, w))

# ---- TF_CONFIG
put("fuzz_tf_config", "worker", json.dumps({
    "cluster": {"chief": ["localhost:2222"], "worker": ["127.0.0.1:2223", "[::1]:2224"], "ps": ["h:2225"],
                "evaluator": ["e:2226"]},
    "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc", "environment": "cloud"}))
put("fuzz_tf_config", "single", '{"cluster": {"worker": ["localhost:12345"]}, "task": {"type": "worker", "index": 0}}')
put("fuzz_tf_config", "empty", "{}")
put("fuzz_tf_config", "duplicate-address", '{"cluster": {"chief": ["h:1"], "worker": ["h:1"]}, "task": {"type": "chief"}}')

# ---- the CLI's config
small = {
    "model": {"input_shape": [8], "layers": [
        {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
        {"class_name": "Dropout", "config": {"rate": 0.1}},
        {"class_name": "Dense", "config": {"units": 4}}]},
    "loss": {"name": "sparse_categorical_crossentropy", "from_logits": True},
    "optimizer": {"name": "sgd", "learning_rate": {"class_name": "ExponentialDecay", "config": {
        "initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.9}}, "momentum": 0.9},
    "metrics": ["accuracy"],
    "data": {"source": "synthetic", "samples": 64, "features": 8, "classes": 4, "labels": "teacher",
             "pipeline": {"cache": True, "shuffle": 64, "prefetch": "autotune"}},
    "epochs": 2, "batch_size": 16, "seed": 1, "strategy": "mirrored", "replicas": 2}
put("fuzz_config", "synthetic", json.dumps(small, indent=1))
put("fuzz_config", "short-forms", json.dumps({
    "model": {"layers": [{"class_name": "Flatten"}, {"class_name": "Dense", "config": {"units": 3}}]},
    "loss": "sparse_categorical_crossentropy", "optimizer": "adam", "data": {"source": "fashion_mnist"}}))
put("fuzz_config", "csv", json.dumps({
    "model": {"layers": [{"class_name": "Dense", "config": {"units": 2}}]}, "loss": "mse",
    "data": {"source": "csv", "train": "/nonexistent/train.csv", "label_column": "y", "allow_non_finite": True}}))
put("fuzz_config", "idx", json.dumps({
    "model": {"layers": [{"class_name": "Dense", "config": {"units": 10}}]}, "loss": "sparse_categorical_crossentropy",
    "data": {"source": "idx", "train_images": "/nonexistent/i", "train_labels": "/nonexistent/l"}}))
put("fuzz_config", "mixed-precision", json.dumps({
    "model": {"input_shape": [4], "layers": [{"class_name": "Rescaling", "config": {"scale": 0.5}},
                                             {"class_name": "Dense", "config": {"units": 2, "use_bias": False}}]},
    "loss": {"name": "categorical_crossentropy", "label_smoothing": 0.1}, "optimizer": {"name": "adamw"},
    "dtype_policy": "mixed_bfloat16", "gradient_accumulation_steps": 2, "validation_split": 0.25}))
