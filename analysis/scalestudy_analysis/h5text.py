"""Attribute values as h5py hands them back, turned into plain Python values. Shared by
the run loader and the kernel-trace reader, which read the same kinds of attributes."""
import numpy as np


def text(value):
    """Scalars as Python values; bytes (fixed-length strings) decoded without padding."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    if isinstance(value, np.ndarray) and value.shape == ():
        return text(value[()])
    if isinstance(value, np.generic):
        return value.item()
    return value


def text_list(value):
    return [str(text(item)) for item in np.atleast_1d(value)]


def attributes(obj):
    return {key: text(value) for key, value in obj.attrs.items()}
