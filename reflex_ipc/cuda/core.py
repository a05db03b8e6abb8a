"""The CUDA runtime the backend talks to: the loaded fatbin, a stream, kernels with
pre-packed arguments, a caching allocator for activations, and the weight arena.

Built by reflex_ipc.cuda's init thread; everything here assumes the primary context
is current in the calling thread.
"""

import os
import struct
import threading
import time

from .fatbin import chosen_image, read_images

# kernel name -> argument layout (struct, native alignment = the C parameter layout).
# Q: pointer, q: long long, i: int, f: float.
MM_TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
SIGNATURES = {
    "add_f32": "QQQq", "mul_f32": "QQQq", "scale_f32": "QfQq",
    "add_row_f32": "QQQqi", "mul_row_f32": "QQQqi", "softcap_f32": "QfQq",
    "silu_f32": "QQq", "gelu_f32": "QQq", "copy_f32": "QQq",
    "swiglu_f32": "QQQqiii", "geglu_f32": "QQQqiii",
    "rmsnorm_f32": "QQQif",
    "rope_f32": "QQiiiiffQif",
    "rmsnorm_rope_f32": "QQQiiififfQif",
    "kv_store": "QQQQQiiii",
    "attention_f16kv": "QQQQQQiiiiiffii", "attention_split_f16kv": "QQQQQQQiiiiiffiii",
    "attention_combine": "QQQiii",
    "copy_cols_f32": "QQqiiiii", "rope_yarn_f32": "QQiiiiffQiffff",
    "mla_attention_split": "QQQQQQiiiiffiii", "mla_attention_split_f32": "QQQQQQiiiiffiii",
    "kv_store_latent_f32": "QQQii",
    "argmax_f32": "QiQ", "topk_f32": "QQiiiQQ",
    "logprob_rows": "QqQQiQ",
    # recurrent.cuh
    "sigmoid_f32": "QQq", "mul_col_f32": "QQQqi", "softplus_f32": "QQq", "columns_f32": "QQqiii",
    "ssm_conv_f32": "QQQQQiiiii",  # x state w y sg n_groups N C K act
    "ssm_conv_state_f32": "QQQiiii",  # x state sg n_groups N C K
    "delta_net_f32": "QQQQQQQQiiiiif",  # q k v g beta state out sg n_groups N Hk Hv D scale
    "ssm_scan_f32": "QQQQQQQQQiiiiii",  # x dt A B C D state y sg n_groups N H P G Ns
    # hybrid.cuh: fused element-wise ops of the hybrid layers (base.py delta_gates ...)
    "delta_gates_f32": "QQQQQQqi",  # alpha bias a b g beta n H
    "delta_qkv_f32": "QQQQiiiiff",  # c q k v N nk nv d eps scale
    "rms_norm_gate_f32": "QQQQiif",  # x w z y rows d eps
    "sigmoid_gate_f32": "QQQqiii",  # a x y n width W start
    # chunked.cuh: the chunked prefill form of delta_net / ssm_scan
    "delta_chunk_prep_f32": "QQQQQQQQQQiiiii",  # q k v g beta Aqk Gc Wv Wk sg n_groups N Hk Hv D
    "delta_chunk_scan_f32": "QQQQQQQQQiiiiif",  # q k Wv Wk Aqk Gc state out sg n_groups N Hk Hv D scale
    "ssm_chunk_prep_f32": "QQQQQQQiiiii",  # C B dt A Aqk Gc sg n_groups N H G Ns
    "ssm_chunk_scan_f32": "QQQQQQQQQQiiiiii",  # C B x dt Aqk Gc D state y sg n_groups N H P G Ns
}
for _t in MM_TYPES:
    for _nt in (1, 4, 8):
        SIGNATURES[f"mm{_nt}_{_t}"] = "QQQiiiqi"
        SIGNATURES[f"mmn{_nt}_{_t}"] = "QQQQQQQiiiiiq"  # W0 W1 W2 X Y0 Y1 Y2 K M0 M1 M2 N rb
        SIGNATURES[f"mmglu{_nt}_{_t}"] = "QQQQiiiqi"  # Wg Wu X Y K M N rb act
    # matvec_nt.cuh (2 <= N < MMA_MIN_N tokens, 8 a block): the arguments of mm / mmn / mmglu
    SIGNATURES[f"mmt8_{_t}"] = "QQQiiiqi"
    SIGNATURES[f"mmtn8_{_t}"] = "QQQQQQQiiiiiq"
    SIGNATURES[f"mmtglu8_{_t}"] = "QQQQiiiqi"
    SIGNATURES[f"get_rows_{_t}"] = "QQQiqf"
    for _nt in (1, 8):
        SIGNATURES[f"hmm{_nt}_{_t}"] = "QQQiiiiq"  # W X Y K M H N rb (mla.cuh)
    # fused.cuh: W0 W1 W2 X nw eps Y0 Y1 Y2 K M0 M1 M2 rb / Wg Wu X nw eps Y K M rb act
    # (+ split), and the split-K matvec W X Y K rb acc
    SIGNATURES[f"mmnorm1_{_t}"] = "QQQQQfQQQiiiiqi"
    SIGNATURES[f"mmgnorm1_{_t}"] = "QQQQfQiiqii"
    SIGNATURES[f"mmsk1_{_t}"] = "QQQiqi"
# bandwidth-shaped one-token matvecs (kernels/matvec.cuh): variants a..e of each kernel
MV_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0")
MV_VARIANTS = ("a", "b", "c", "d", "e")
for _t in MV_TYPES:
    for _v in MV_VARIANTS:
        SIGNATURES[f"mv{_v}_{_t}"] = "QQQiiqi"  # W X Y K M rb acc
        SIGNATURES[f"mvn{_v}_{_t}"] = "QQQQQfQQQiiiiqi"  # W0 W1 W2 X nw eps Y0 Y1 Y2 K M0 M1 M2 rb norm
        SIGNATURES[f"mvglu{_v}_{_t}"] = "QQQQfQiiqii"  # Wg Wu X nw eps Y K M rb act norm
# q k v qw kw kc vc pos slots N Hq Hkv hd dv ctx norm eps n_rot base freq_scale ff neox mscale
SIGNATURES["qk_rope_kv_store_f32"] = "QQQQQQQQQiiiiiiififfQif"
# q kc vc part_ml part_acc out count pos mask Hq Hkv hd ctx n_kv scale softcap causal window chunk
SIGNATURES["attention_split_last_f16kv"] = "QQQQQQQQQiiiiiffiii"
# mixture of experts (kernels/moe.cuh): the routing, then expert matvecs that read the ids
SIGNATURES["moe_route_f32"] = "QQQQQiiiifii"  # logits bias escale ids wts E k gating norm scale G G_used
for _t in MM_TYPES:
    SIGNATURES[f"moe_glu_{_t}"] = "QQQQQiiiqqi"  # Wg Wu X ids Y K F k estride rb act
    SIGNATURES[f"moe_mm_{_t}"] = "QQQQiiiqq"  # W X ids Y K M x_div estride rb
    SIGNATURES[f"moe_down_{_t}"] = "QQQQQiiiqq"  # W H ids wts Y F D k estride rb
# tensor-core prefill matmuls (kernels/mma.cuh): every block format, and f16/bf16
MMA_TYPES = tuple(t for t in MM_TYPES if t != "f32")
for _t in MMA_TYPES:
    SIGNATURES[f"mma_{_t}"] = "QQQiiiqiQ"  # W Xh Y K M N rb accumulate P
    SIGNATURES[f"mmaglu_{_t}"] = "QQQQiiiqiQ"  # Wg Wu Xh Y K M N rb act P
SIGNATURES["mma_x_f16"] = "QQq"  # x xh n
SIGNATURES["mma_reduce"] = "QQiiqi"  # P Y S NW NM mode
# tensor-core prefill attention (kernels/flash.cuh), one kernel per head width:
# q kc vc out part_ml part_acc pos mask N Hq Hkv ctx n_kv scale softcap causal window chunk
for _hd in (64, 128, 256):
    SIGNATURES[f"flash_attention_f16kv_{_hd}"] = "QQQQQQQQiiiiiffiii"


class Kernel:
    """A kernel of the fatbin; calling it packs the arguments with a precompiled struct
    and launches on the runtime's stream (no per-call format parsing)."""

    __slots__ = ("name", "pack", "_launch", "stream")

    def __init__(self, func, name, fmt, stream):
        self.name = name
        self.pack = struct.Struct(fmt).pack
        self._launch = func._launch_kernel
        self.stream = stream

    def __call__(self, grid, block, *args, shared=0):
        self._launch(grid, block, self.pack(*args), shared, self.stream)


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
        self._klock = threading.Lock()
        self.profiler = None  # $REFLEX_PROFILE=1: per-kernel GPU times (cuda/profile.py)
        self._kernel_cls = Kernel
        if os.environ.get("REFLEX_PROFILE") == "1":
            from .profile import Profiler, wrap_kernel

            self.profiler = Profiler(drv, self.stream)
            self._kernel_cls = wrap_kernel(Kernel)

    def kernel(self, name) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            with self._klock:
                fmt = SIGNATURES[name]
                k = self._kernel_cls(self.module.get_function(name), name, fmt, self.stream)
                self._kernels[name] = k
        return k

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


__all__ = ["Runtime", "Kernel", "Pool", "SIGNATURES", "MM_TYPES", "MMA_TYPES", "MV_TYPES", "MV_VARIANTS", "read_images",
           "chosen_image"]
