"""Device arrays (float32 / float16 / int32 / float64, C-contiguous) and quantized device weights."""

import math

ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4, "float64": 8}


class _Block:
    """A pool block; returned to the pool when the last array viewing it goes away."""

    __slots__ = ("pool", "ptr", "cls")

    def __init__(self, pool, nbytes):
        self.pool = pool
        self.ptr, self.cls = pool.alloc(nbytes)

    def __del__(self):
        try:
            self.pool.give_back(self.ptr, self.cls)
        except Exception:
            pass


class DeviceArray:
    """A C-contiguous array in device memory. Views (reshape, leading-axis slices) share
    the block that owns the memory."""

    __slots__ = ("ptr", "shape", "dtype", "owner")

    def __init__(self, ptr, shape, dtype, owner):
        self.ptr = ptr
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.owner = owner

    @classmethod
    def empty(cls, pool, shape, dtype="float32"):
        n = math.prod(shape) * ITEMSIZE[dtype]
        blk = _Block(pool, n)
        return cls(blk.ptr, shape, dtype, blk)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def itemsize(self):
        return ITEMSIZE[self.dtype]

    @property
    def nbytes(self):
        return self.size * ITEMSIZE[self.dtype]

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if -1 in shape:
            i = shape.index(-1)
            rest = math.prod(s for j, s in enumerate(shape) if j != i)
            shape[i] = self.size // rest if rest else 0
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return DeviceArray(self.ptr, shape, self.dtype, self.owner)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, idx):
        """Leading-axis indexing and slicing with step 1 (a view)."""
        n = self.shape[0]
        row = math.prod(self.shape[1:]) * self.itemsize
        if isinstance(idx, slice):
            start, stop, step = idx.indices(n)
            if step != 1:
                raise IndexError("device arrays support only step-1 slices")
            stop = max(stop, start)
            return DeviceArray(self.ptr + start * row, (stop - start,) + self.shape[1:], self.dtype,
                               self.owner)
        if isinstance(idx, int):
            if idx < 0:
                idx += n
            if not 0 <= idx < n:
                raise IndexError(f"index {idx} out of range for length {n}")
            return DeviceArray(self.ptr + idx * row, self.shape[1:], self.dtype, self.owner)
        raise IndexError(f"device arrays support int and slice indices, not {type(idx).__name__}")

    def __repr__(self):
        return f"<DeviceArray {self.dtype}{list(self.shape)} @ {self.ptr:#x}>"


class DeviceWeight:
    """A weight matrix kept in its GGUF block format on the device.

    shape is numpy order (rows, cols) = (ggml ne1, ne0); each row is row_bytes bytes.
    """

    __slots__ = ("ptr", "shape", "ggml_type", "type_name", "row_bytes", "name", "owner")

    def __init__(self, ptr, shape, ggml_type, type_name, row_bytes, name, owner=None):
        self.ptr = ptr
        self.shape = tuple(shape)
        self.ggml_type = ggml_type
        self.type_name = type_name
        self.row_bytes = row_bytes
        self.name = name
        self.owner = owner

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"<DeviceWeight {self.name} {self.type_name}{list(self.shape)}>"
