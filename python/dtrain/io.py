"""tf.io: TFRecordWriter, TensorFlow's framing of records (what tf.data.TFRecordDataset reads)."""
import os

from . import _dtrain


class TFRecordWriter:
    """tf.io.TFRecordWriter(path): writes records (bytes, or str as UTF-8) to a new file, each
    framed as TensorFlow frames it ([u64 length][masked CRC-32C of it][bytes][masked
    CRC-32C of them]). A context manager; close() flushes, and errors name the file."""

    def __init__(self, path, options=None):
        if options not in (None, ""):
            raise ValueError(f"TFRecordWriter: options {options!r}: dtrain writes uncompressed TFRecord files only")
        self._writer = _dtrain.data._TFRecordWriter(os.fspath(path))

    def write(self, record):
        if isinstance(record, str):
            record = record.encode()
        self._writer.write(bytes(record))

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
