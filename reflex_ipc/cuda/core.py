"""The CUDA runtime the backend talks to: the loaded fatbin, a stream, kernel launchers with
keyword arguments (generated from the kernel sources: cuda/abi.py, cuda/launch.py), a caching
allocator for activations, and the weight arena.

Built by reflex_ipc.cuda's init thread; everything here assumes the primary context
is current in the calling thread.
"""

import os
import struct
import threading
import time

from . import launch as _launch
from .fatbin import chosen_image, read_images

# The kernels' argument layouts and launchers, generated from kernels/*.cuh (cuda/abi.py):
# KERNELS[name] = (struct format: Q pointer, q long long, i int, f float; launcher factory).
KERNELS = _launch.KERNELS
# the kernels of the other fatbins: name -> the fatbin file that holds them (Runtime loads it at
# the first use of one of its kernels: the main fatbin, read at every start, stays as it was)
MODULE_OF = _launch.MODULE_OF
# the block formats with matmul kernels (mm*, mmn*, mmglu*, get_rows_*, moe_*, ...), those of the
# tensor-core ones (mma.cuh), and the bandwidth-shaped matvecs' formats and variants (matvec.cuh)
MM_TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
MMA_TYPES = tuple(t for t in MM_TYPES if t != "f32")
MV_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0")
# the IQ formats, TQ1_0 / TQ2_0 and MXFP4: the same families (mm*, mma*, mmt*, mmnorm*, hmm*, moe_*,
# get_rows_*) in reflex_kernels_iq.fatbin (kernels/iq_all.cu, iq.cuh's block readers)
IQ_TYPES = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "tq1_0",
            "tq2_0", "mxfp4")
MV_VARIANTS = ("a", "b", "c", "d", "e")


def __getattr__(name):
    if name == "SIGNATURES":  # {kernel: struct format} (tests and scripts; not on the launch path)
        return {k: fmt for k, (fmt, _) in KERNELS.items()}
    raise AttributeError(name)


def make_kernel(func, name, stream, pack=None, launch=None):
    """The launcher of kernel `name` of the loaded module (func: its pycuda Function): called
    as `k(grid, block, <the kernel's parameters by name>, shared=0)` (a kernel of more than
    abi.MAX_KW parameters: `k(grid, block, k.head(<its leading ones by name>), <the rest>)`),
    it packs the arguments with a precompiled struct (the C parameter layout) and launches on
    `stream`. pack and launch replace the struct's pack and func._launch_kernel (tests, the
    profiler)."""
    fmt, factory = KERNELS[name]
    return factory(launch or func._launch_kernel, pack or struct.Struct(fmt).pack, stream)


def guarded_launch(name, inner, guard):
    """A make_kernel `launch` that hands the pointer arguments of kernel `name` (its layout's Q
    fields, unpacked from the packed arguments) to guard(list) and then launches with inner."""
    fmt = KERNELS[name][0]
    st = struct.Struct(fmt)
    where = [i for i, c in enumerate(fmt) if c == "Q"]

    def launch(grid, block, args, shared, stream):
        vals = st.unpack(args)
        guard([vals[i] for i in where])
        return inner(grid, block, args, shared, stream)

    return launch


class Pool:
    """Caching device allocator: blocks freed by DeviceArray go back to a free list by
    size class and are reused; all work runs on one stream, so reuse is ordered."""

    def __init__(self, drv):
        self.drv = drv
        self.free = {}  # size class -> [ptr]
        self.held = {}  # ptr -> (DeviceAllocation, size class)
        self.bytes = 0

    @staticmethod
    def size_class(n):
        n = max(256, (n + 255) & ~255)
        p = 1 << (n - 1).bit_length()
        return p if n > p * 3 // 4 else p * 3 // 4

    def alloc(self, nbytes):
        """(device pointer, size class) of a block of at least nbytes."""
        c = self.size_class(nbytes)
        lst = self.free.get(c)
        if lst:
            return lst.pop(), c
        try:
            a = self.drv.mem_alloc(c)
        except self.drv.MemoryError:
            self.release_cached()
            a = self.drv.mem_alloc(c)
        self.held[int(a)] = (a, c)
        self.bytes += c
        return int(a), c

    def give_back(self, ptr, c):
        self.free.setdefault(c, []).append(ptr)

    def release_cached(self):
        """Free every cached block (on memory pressure)."""
        self.stream_sync()
        for lst in self.free.values():
            for p in lst:
                a, c = self.held.pop(p)
                a.free()
                self.bytes -= c
        self.free = {}

    def stream_sync(self):
        self.drv.Context.synchronize()

    def free_all(self):
        """Free every block, in use or cached (a graph's private pool, when the graph goes)."""
        for a, _ in self.held.values():
            a.free()
        self.held, self.free, self.bytes = {}, {}, 0


class Runtime:
    def __init__(self, drv, dev, ctx, timings):
        from . import FATBIN_PATH, build_info

        self.drv = drv
        self.device = dev
        self.ctx = ctx
        self.timings = timings
        self.name = dev.name()
        self.cc = dev.compute_capability()
        self.build = build_info()
        t0 = time.perf_counter()
        with open(FATBIN_PATH, "rb") as fh:
            data = fh.read()
        self.images = read_images_bytes(data)
        self.module = drv.module_from_buffer(data)
        timings["module_load_ms"] = (time.perf_counter() - t0) * 1e3
        self.image = chosen_image(self.images, self.cc)
        self.stream = drv.Stream()
        self.upload_stream = drv.Stream()
        self.pool = Pool(drv)
        self._kernels = {}
        self._modules = {}  # the other fatbins loaded so far: file -> module
        self._klock = threading.Lock()
        self.profiler = None  # $REFLEX_PROFILE=1: per-kernel GPU times (cuda/profile.py)
        from .. import settings

        if settings.get().profile:
            from .profile import Profiler

            self.profiler = Profiler(drv, self.stream)

    def kernel(self, name):
        """Kernel `name`'s launcher (make_kernel), made at its first use."""
        k = self._kernels.get(name)
        if k is None:
            with self._klock:
                func = self._module_of(name).get_function(name)
                launch = None
                if self.profiler is not None:
                    from .profile import timed_launch

                    launch = timed_launch(name, func._launch_kernel)
                k = make_kernel(func, name, self.stream, launch=launch)
                self._kernels[name] = k
        return k

    def _module_of(self, name):
        """The module holding kernel `name`: the main fatbin's, or another fatbin's (MODULE_OF),
        loaded now if it is not yet (under _klock). A missing file is a cuda_error naming it."""
        fat = MODULE_OF.get(name)
        if fat is None:
            return self.module
        m = self._modules.get(fat)
        if m is None:
            from . import KERNEL_DIR

            path = os.path.join(KERNEL_DIR, fat)
            t0 = time.perf_counter()
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as e:
                from ..errors import ReflexError

                raise ReflexError("cuda_error", f"kernel {name} is in {path}, which cannot be read ({e}): the "
                                  "kernels were built without it; rebuild them (python kernels/build.py)") from None
            m = self._modules[fat] = self.drv.module_from_buffer(data)
            self.timings[f"module_load_ms[{fat}]"] = (time.perf_counter() - t0) * 1e3
        return m

    def guarded_kernel(self, name, guard):
        """kernel(name) whose every launch first calls guard(pointers): the values of the
        kernel's pointer parameters (the streaming upload's check that what it reads is on the
        device)."""
        with self._klock:
            func = self._module_of(name).get_function(name)
        inner = func._launch_kernel
        if self.profiler is not None:
            from .profile import timed_launch

            inner = timed_launch(name, inner)
        return make_kernel(func, name, self.stream, launch=guarded_launch(name, inner, guard))

    def loaded_binary_version(self, name="argmax_f32"):
        """The architecture of the code the driver loaded for a kernel (e.g. 90)."""
        f = self.module.get_function(name)
        return f.get_attribute(self.drv.function_attribute.BINARY_VERSION)

    def synchronize(self):
        self.stream.synchronize()

    def mem_info(self):
        free, total = self.drv.mem_get_info()
        return {"free": free, "total": total}


def read_images_bytes(data):
    from .fatbin import images

    return images(data)


__all__ = ["Runtime", "make_kernel", "Pool", "KERNELS", "MM_TYPES", "MMA_TYPES", "MV_TYPES", "MV_VARIANTS",
           "read_images", "chosen_image"]
