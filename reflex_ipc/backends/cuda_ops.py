"""Backend ops on the ahead-of-time CUDA kernels (kernels/*.cuh), through pycuda.

Weights stay in their GGUF block format in one device arena per file (see
reflex_ipc.cuda.weights); matmuls and embedding lookups read the blocks directly.
Activations are float32 DeviceArrays from a caching pool; the KV cache is float16.
Everything runs in order on one stream; only to_numpy() (and the sampled token id)
waits for the device.
"""

import math

import numpy as np

from .. import cuda as _cuda
from ..cuda.arrays import DeviceArray, DeviceWeight
from ..cuda.weights import WeightArena
from ..errors import ReflexError
from .base import (OAI_ALPHA, OAI_LIMIT, check_glu, check_matmul_n, fusion_on, host_topk, moe_route,
                   seq_group_table, swiglu_oai, unique_ids, weight_shape)
from ..ggml_types import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, TYPES, type_name

MM_KERNEL = {F32: "f32", F16: "f16", BF16: "bf16", Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0",
             Q5_1: "q5_1", Q8_0: "q8_0", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k"}
# the IQ formats, TQ1_0 / TQ2_0 and MXFP4: every matmul family too (kernels/iq_all.cu: the families'
# own kernels over iq.cuh's block readers), in the fatbin loaded when such a weight is
IQ_KERNEL = {TYPES[n.upper()][0]: n for n in ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
                                            "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4")}
MM_KERNEL.update(IQ_KERNEL)
EW_BLOCK = 256
MM_ROWS = 4  # rows per block of the matmul kernels (MM_ROWS in matmul.cuh)
# tensor-core matmuls (kernels/mma.cuh) for prefill: x of MMA_MIN_N or more rows, weights of
# these formats, sm_80+; REFLEX_MMA=0 keeps every matmul on the per-row kernels (A/B runs).
# Device time on the H200 (split K, below): a [1024, 1024] Q8_0 weight ~15 us at N = 32..128
# (x conversion, mma, reduce: three launches) against 14 / 31 / 48 us on the per-row kernels,
# but launched eagerly from Python the three launches cost ~30 us of host time whatever N
# (opchecks.bench_gemm's sweep), which the one per-row launch beats below 64 tokens.
MMA_MIN_N = 64
MMA_FORMATS = frozenset(t for t in MM_KERNEL if t != F32)  # f32 would lose bits as f16
MMA_BM, MMA_BN, MMA_THREADS = 64, 64, 256  # MMA_BM, MMA_BN, MMA_THREADS in mma.cuh
MMA_BK = {1: 64, 2: 32}  # columns per slice: MMA_BK (one weight), MMA_BK_GLU (gated unit)
# resident blocks per SM of mma_* / mmaglu_* (their __launch_bounds__ minimum in mma.cuh):
# K is split over blocks until the grid fills that many per SM (one wave), since a block is
# bound by its serial walk over K, not by the tensor cores
MMA_BLOCKS_PER_SM = {1: 3, 2: 3}
NORM_ROPE_ROWS = 4  # RMSNORM_ROPE_ROWS in elementwise.cuh
QK_ROPE_ROWS = 4  # QK_ROPE_ROWS in fused.cuh
# one-token matvecs of at most this many rows run a block per row, its threads over K (fused.cuh's
# split layout: the few thousand rows of a small model's projections fill the GPU that way);
# more rows (an LM head) keep a warp per row (with REFLEX_FUSE=0: a warp per row always).
MM_SPLIT_ROWS = 16384
# matvecs of 2 <= N < MMA_MIN_N tokens (kernels/matvec_nt.cuh: mmt / mmtn / mmtglu): a block of
# MMT_THREADS threads per MMT_ROWS weight rows (the gated unit: MMT_ROWS / 2 rows of gate and of
# up), its threads over K, MMT_NT = 8 tokens a block (grid y: token groups; a short last group
# skips the missing tokens). CudaOps.mmnt False keeps the warp-per-row mm4 / mm8 kernels (tests).
MMT_THREADS, MMT_ROWS, MMT_NT = 128, 4, 8  # MMT_THREADS, MMT_R, the NT instantiated in matvec_nt.cuh
# bandwidth-shaped one-token matvecs (kernels/matvec.cuh) for these formats: variant -> (rows a
# group R, warps a group W (over K), groups a block G, steps in flight U), as RX_MV instantiates
# them. REFLEX_MATVEC=new (the default) sends one-token matmuls (plain, q/k/v, gated, and the
# RMSNorm-folded ones) there where mv_pick has a variant, =old keeps matmul.cuh / fused.cuh;
# CudaOps.mv_variant forces one variant (tests, scripts/gpu/gpu-matvec).
MV_KERNEL = {Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k", Q8_0: "q8_0"}
MV_VARIANTS = {"a": (1, 4, 1, 2), "b": (2, 4, 1, 1), "c": (4, 2, 1, 1), "d": (2, 1, 4, 1), "e": (4, 1, 2, 1)}
MV_ALIGN = {Q4_K: 16, Q5_K: 16, Q6_K: 2, Q8_0: 2}  # weight pointer alignment the kernels' loads need
MV_LANES = {Q4_K: 8, Q5_K: 8, Q6_K: 8, Q8_0: 2}  # lanes sharing one block (MV<T>::P)
# matvec.cuh's variant per (kernel kind, format, row width K, rows), from the H200 sweep of
# scripts/gpu/gpu-matvec (bench/results/matvec-h200-*.json: 0.6B / 8B / 32B Qwen3 shapes, cold
# L2); None: the older kernels of matmul.cuh / fused.cuh, faster there (short Q8_0 rows).
def mv_pick(t, K, rows, kind="mv"):
    """matvec.cuh's variant for one token times `rows` output rows of width K in format t
    (kind "mv" plain, "mvn" q/k/v or the LM head with the norm folded, "mvglu" gate/up), or
    None for the older kernels."""
    name = MV_KERNEL[t]
    if kind == "mvglu":
        return {"q6_k": "d", "q8_0": "c"}.get(name, "e")
    if kind == "mvn":
        if name == "q6_k":
            return "d" if rows > 32768 else "e"
        return "e"
    if name == "q6_k":
        return "b"
    if name == "q8_0":
        return None if K <= 3072 else "c"
    return "b" if K <= 3072 else "c"


def mv_grid(v, rows):
    """(grid, block) of matvec.cuh's variant v for `rows` output rows."""
    R, W, G, _ = MV_VARIANTS[v]
    return (-(-rows // (R * G)), 1, 1), (32 * W * G, 1, 1)


ATT_MAX_HD = 256
ATT_WARPS = 16  # ATT_WARPS in attention.cuh
ATT_SPLIT_BELOW = 132  # split the keys over blocks when fewer (head, query) blocks than this
ATT_CHUNK = 128  # keys per split block (at least)
ATT_MAX_SPLITS = 64
# tensor-core prefill attention (kernels/flash.cuh) for N >= FLASH_MIN_N queries of these head
# widths on sm_80+, in place of attention_f16kv (the split-key decode path keeps few queries
# over many keys); REFLEX_FLASH=0 keeps attention_f16kv (A/B, kill switch). Q and P are rounded
# to f16 there (opchecks.FLASH_TOL).
FLASH_MIN_N = 16
FLASH_HD = (64, 128, 256)
FLASH_BM = 64  # FLASH_BM in flash.cuh: rows (query, head of a kv group) per block
FLASH_THREADS = 128  # 32 * FLASH_WARPS
# split keys (flash.cuh's gridDim.z, merged by attention_combine) when the row tiles alone give
# fewer than FLASH_SPLIT_BELOW * SMs blocks over more than 2 * FLASH_CHUNK keys: up to
# FLASH_MAX_SPLITS shares of >= FLASH_CHUNK keys (a multiple of 64, the widest key tile) until
# about FLASH_SPLIT_TARGET blocks per SM
FLASH_SPLIT_BELOW = 0.5
FLASH_CHUNK = 256
FLASH_MAX_SPLITS = 32
FLASH_SPLIT_TARGET = 2
# latent attention (deepseek2) of MLA_FLASH_MIN_N or more queries (prefill; never a captured
# bucket, which holds at most 64) with keys and values decompressed per head (two GEMMs on the
# latents, attn_k_b transposed to f16 once per layer) and the flash kernel of these (key, value)
# widths; fewer queries (decode) keep the absorbed form over the latent cache, and so do more
# than MLA_FLASH_MAX_KEYS keys (the decompressed heads would take ~1.3 KB a key and head).
# REFLEX_MLA_FLASH=0 always keeps it.
MLA_FLASH_MIN_N = 128
MLA_FLASH_MAX_KEYS = 16384
MLA_FLASH_KV = {(192, 128): "192_128"}  # (nope + rope, v) -> flash_attention_f16kv_* (flash.cuh)
MLA_WARPS = 8  # MLA_WARPS in mla.cuh
MLA_MAX_D = 640  # 32 * MLA_MAXD in mla.cuh: the latent attention's widest key
TOPK_SLICE = 4096
TOPK_MAX = 1024
MOE_ROUTE_THREADS = 256  # MOE_ROUTE_THREADS in moe.cuh
MOE_ROUTE_SHARED = 46 * 1024  # dynamic shared memory of moe_route_f32 (48 KiB in all without opt-in)
# routings of up to MOE_ROUTE_WARP_MAXE experts without groups take moe_route_warp_f32 (a warp per
# token, MOE_ROUTE_WARP_TOKENS a block: no block barriers; the same ids), unless moe_route_warp is off
MOE_ROUTE_WARP_MAXE, MOE_ROUTE_WARP_TOKENS = 256, 4
# mixtures of experts of MOE_MMA_MIN_N or more tokens (prefill) on tensor cores: moe_group_i32
# sorts the (token, slot) pairs by expert on the device, mmaglu_moe_* / mma_moe_* (mma.cuh) run
# each expert's gathered rows through its gate/up and down tiles, moe_wsum_f32 adds each token's
# k rows with their weights in slot order (deterministic). Fewer tokens (decode) keep the matvec
# per pair (moe_glu / moe_down); REFLEX_MOE_MMA=0 always does. A one-block grouping kernel of
# MOE_GROUP_WARPS warps at most (fewer when E is large: its counts are [warps][E] ints).
MOE_MMA_MIN_N = 48  # H200 crossover 41-45 tokens (bench/results/issue27-h200-6653985)
# the grouped GEMMs' flags (mma.cuh): MOE_SKIP by REFLEX_MOE_SKIP, MOE_WIDE by REFLEX_MMA_WIDE (the
# dense GEMMs: MMA_WIDE in their mode), only for the formats DeqWide reads, from tensors aligned
# as it needs (_wide_ok)
MOE_SKIP, MOE_WIDE, MMA_WIDE = 1, 2, 4
WIDE_ALIGN = {Q4_K: 16, Q5_K: 16, Q6_K: 8}
MOE_GROUP_WARPS = 32
MOE_GROUP_SHARED = 46 * 1024
# the per-pair form (decode, short prompts) with experts in matvec.cuh's formats (MV_KERNEL):
# kernels/moe_mv.cuh's moe_mvglu{V}_* (gate/up of each pair on matvec.cuh's layout, variants
# MOE_MV_GLU of MV_VARIANTS) and moe_mvdown_* (a block: MOE_MVD_R rows of one token for all k
# pairs, a warp a pair, min(k, MOE_MVD_WARPS) warps, the weighted dots summed in slot order
# through shared memory); REFLEX_MATVEC=old keeps moe.cuh's moe_glu / moe_down. Decode reads
# ~14 + 10 MB a layer on the Qwen3-30B-A3B shape: registers capped so that 16 warps an SM stay
# resident (gate/up's 768 blocks of 2 warps in one wave, down's 512 of 8 in two), each warp with
# 4-8 rows' loads in flight (40-55 KB an SM), where moe_glu / moe_down had one row a warp.
MOE_MV_GLU = ("c", "d", "e")
MOE_MVD_R, MOE_MVD_WARPS = 4, 8  # MOE_MVD_R, MOE_MVD_WARPS in moe_mv.cuh
MOE_MV_MAX_PAIRS = 65535  # grid y of moe_mvglu (pairs) and moe_mvdown (tokens)


def moe_mv_pick(t):
    """moe_mvglu's variant for experts of format t: as mvglu's (a warp over whole rows for the
    short rows of K-block quants, two warps a row for Q8_0's), but d for Q5_K: its e / c spill
    under moe_mv.cuh's register cap (16 warps an SM), d does not."""
    return {"q5_k": "d", "q6_k": "d", "q8_0": "c"}.get(MV_KERNEL[t], "e")


def moe_mv_grid(v, F, P):
    """(grid, block) of moe_mvglu variant v for F rows of each of P pairs."""
    R, W, G, _ = MV_VARIANTS[v]
    return (-(-F // (R * G)), P, 1), (32 * W * G, 1, 1)


HYB_ROWS = 4  # rows (warps) per block of delta_qkv_f32 / rms_norm_gate_f32 (kernels/hybrid.cuh)
RECUR_WARPS = 4  # state rows (one warp each) per block of delta_net_f32 / ssm_scan_f32
RECUR_MAX_COLS = 256  # 32 lanes x RECUR_MAX_PER_LANE (recurrent.cuh): the widest state row
CONV_TOKEN_BLOCKS = 64  # ssm_conv_f32: blocks along the tokens of a prefill (blockIdx.z)
# The chunked (parallel) form of delta_net / ssm_scan (kernels/chunked.cuh) for a call whose
# longest sequence group has CHUNK_MIN tokens or more; shorter calls (decode, T = 1, and the
# few-token groups of system1's candidates) keep the sequential kernels of recurrent.cuh. The
# sequential kernel walks T dependent steps (two warp reductions and the token's loads each),
# the chunked form pays two launches, a workspace and a whole CHUNK_L-token chunk's tile work
# whatever T. Measured on the H200 (Qwen3.5-2B layer, one call): T=64 chunked 95 us vs
# sequential 76; T=512 524 vs 567 (in the model 362 vs 525); T=1024 1099 vs 1576: two chunks
# and up. CudaOps.chunked False keeps the sequential kernels for prefill too (gpu-check times both).
CHUNK_L = 64  # CHUNK_L in chunked.cuh: tokens per chunk
CHUNK_ROWS = 16  # CHUNK_ROWS in chunked.cuh: state rows per block of *_chunk_scan_f32
CHUNK_THREADS = 256  # CHUNK_THREADS in chunked.cuh
CHUNK_MIN = 128


def yarn_args(yarn, n_rot, base, freq_scale, mscale):
    """(ext_factor, lo, hi, mscale) for rope_yarn_f32 from rope's yarn tuple (ext_factor,
    n_ctx_orig, beta_fast, beta_slow): the correction dims [lo, hi] and the attention factor
    times YaRN's 1 + 0.1 ln(1 / freq_scale) (base.Ops.rope)."""
    ext_factor, n_ctx_orig, beta_fast, beta_slow = yarn

    def corr_dim(b):
        return n_rot * math.log(n_ctx_orig / (b * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0.0, math.floor(corr_dim(beta_fast)))
    hi = min(n_rot - 1.0, math.ceil(corr_dim(beta_slow)))
    return float(ext_factor), lo, hi, mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale))


def mla_split_plan(n_rows, n_kv):
    """(chunk, S): the keys per block and the number of key blocks of mla_attention_split for
    n_rows (query, head) pairs over n_kv keys: split like attention when there are few rows."""
    if n_rows < ATT_SPLIT_BELOW and n_kv > ATT_CHUNK:
        chunk = max(ATT_CHUNK, -(-n_kv // ATT_MAX_SPLITS))
    else:
        chunk = max(1, n_kv)
    return chunk, -(-max(1, n_kv) // chunk)


def _ew_grid(n):
    return (max(1, min((n + EW_BLOCK - 1) // EW_BLOCK, 8192)), 1, 1)


def _cuda_runtime():
    """cuda.runtime() looked up when called, so that replacing it (tests) reaches every backend
    made after the replacement."""
    return _cuda.runtime()

class CudaOps:
    name = "cuda"
    device = "cuda"
    kv_dtype = "float16"
    # slot arrays a model marks exact (runtime.state.SlotSpec(exact=True): deepseek2's MLA latent,
    # both its keys and its values) stay float32 (issue 32 item 18)
    exact_kv_dtype = "float32"
    prefill_chunk = 1024
    max_state_cols = RECUR_MAX_COLS  # the widest row of a delta_net / ssm_scan state (base.py)
    mma_min_n = MMA_MIN_N
    mmnt = False  # matmuls of 2..63 tokens on matvec_nt.cuh: __init__ sets it (False: warp-per-row)
    flash = False  # the tensor-core prefill attention (set in __init__: sm_80+, REFLEX_FLASH)
    flash_min_n = FLASH_MIN_N
    flash_launches = 0
    flash_last_splits = 0  # gridDim.z of the last one (1: not split)

    # delta_net / ssm_scan: the chunked kernels for calls with a group of chunk_min tokens or
    # more (CHUNK_MIN; chunked False: never); the calls of each path are counted
    # (recur_calls: gpu-check reports which one a prefill ran)
    chunked = True
    chunk_min = CHUNK_MIN
    n_chunked_calls = 0
    n_sequential_calls = 0

    _guarded = None  # (see __init__)
    # mixtures of experts run on the device, so a graph can hold them (see moe)
    _moe_host_mode = False
    moe_capturable = True
    moe_mma = False  # prefill MoE on the grouped tensor-core GEMMs (set in __init__: sm_80+, REFLEX_MOE_MMA)
    moe_mma_min_n = MOE_MMA_MIN_N
    moe_mma_launches = 0  # moe calls that took the grouped GEMMs (opchecks asserts it)
    moe_skip = True  # REFLEX_MOE_SKIP (MOE_SKIP); opchecks compares both
    mma_wide = True  # REFLEX_MMA_WIDE (MOE_WIDE, MMA_WIDE); opchecks compares both
    wide_launches = 0  # tensor-core launches that read their weights with DeqWide (gpu-moetile reports it)
    # the per-pair form's down projection as a warp per (pair, row) (moe_mm_*, x_div 1) and then
    # moe_wsum_f32, instead of moe_down_*'s warp per row walking a token's k experts in turn:
    # k times the warps for decode's one token, one more launch, the same bits. Off until the
    # H200 measures it (opchecks.bench_moe's device_N1_graph_split_us against device_N1_graph_us).
    moe_down_split = False
    mla_flash = False  # long-prompt latent attention decompressed + flash (__init__: sm_80+, REFLEX_MLA_FLASH)
    mla_flash_min_n = MLA_FLASH_MIN_N
    mla_flash_launches = 0
    # one-token matvecs on matvec.cuh (REFLEX_MATVEC=new) and a forced variant (see MV_KERNEL)
    matvec = False
    mv_variant = None
    moe_mv_variant = None  # forces moe_mvglu's variant (one of MOE_MV_GLU: opchecks, tests)
    moe_route_warp = True  # moe_route_warp_f32 where it serves (see MOE_ROUTE_WARP_MAXE)
    moe_mv_launches = 0  # moe_mvglu / moe_mvdown launches (opchecks asserts them)

    def __init__(self):
        from .. import settings

        s = settings.get()
        # REFLEX_CUDA_MOE=host: mixtures of experts routed on the host (A/B, fallback); such a
        # step waits for the device, so MoE models are then not captured in graphs
        self._moe_host_mode = s.cuda_moe == "host"
        self.graphs = s.cuda_graph  # capture's graphs replayed by the runtime ($REFLEX_CUDA_GRAPH)
        self.moe_capturable = not self._moe_host_mode
        self.rt = _cuda_runtime()
        self.pool = self.rt.pool
        self.k = self.rt.kernel
        self._arenas = {}
        self._guarded = None  # kernel name -> launcher behind _stream_guard (while streaming)
        self._extra_weights = []
        self._graph = None
        self._att_count = None  # attention_split_last_f16kv's tickets (_att_tickets)
        self._seq_memo = None  # (seqs array, _seq_arg's answer, its device buffer): layers share it
        self.mma = s.mma and tuple(self.rt.cc) >= (8, 0)
        self.mmnt = True
        self.flash = s.flash and tuple(self.rt.cc) >= (8, 0)
        self.moe_mma = s.moe_mma and tuple(self.rt.cc) >= (8, 0)
        self.moe_mma_min_n = MOE_MMA_MIN_N
        self.moe_mma_launches = 0
        self.moe_skip = s.moe_skip
        self.mma_wide = s.mma_wide
        self.mla_flash = s.mla_flash and tuple(self.rt.cc) >= (8, 0)
        self.mla_flash_min_n = MLA_FLASH_MIN_N
        self.mla_flash_launches = 0
        self._mla_kbt = {}  # attn_k_b's device address -> its per-head transpose (f16 DeviceWeight)
        self.flash_min_n = FLASH_MIN_N
        self.flash_launches = 0  # attention calls that ran flash_attention_f16kv_* (opchecks asserts it)
        self.chunked = True
        self.matvec = s.matvec == "new"  # see MV_KERNEL
        self.mv_variant = None
        self.moe_mv_variant = None
        self.moe_mv_launches = 0

    def _k_after_upload(self, name):
        """Kernel lookup while weight uploads are in flight. An arena streaming from a cold file
        (cuda/weights.py): launchers that first make sure every tensor the kernel's pointers
        fall in is on the device (_stream_guard), so the first layers run while later ones are
        read. Else (or once every stream is done) the first launch waits for the uploads (weights
        loaded earlier may be read by any kernel), then lookups go direct."""
        if self.uploading():
            if self._guarded is None:
                self._guarded = {}
            k = self._guarded.get(name)
            if k is None:
                k = self._guarded[name] = self.rt.guarded_kernel(name, self._stream_guard)
            return k
        for a in self._arenas.values():
            a.wait()
        self.k = self.rt.kernel
        self._guarded = None
        return self.k(name)

    def _stream_guard(self, ptrs):
        """A kernel's pointer arguments: each one inside a streaming arena waits for its tensor
        (an arena not streaming is waited for whole)."""
        for a in self._arenas.values():
            lo, hi = a.base, a.base + a.nbytes
            for p in ptrs:
                if lo <= p < hi:
                    if a.queue is None:
                        a.wait()
                    else:
                        a.ensure_ptr(p)

    def _moe_experts_ready(self, ids, parts):
        """Before a MoE layer's expert kernels read expert rows from a streaming arena: the
        routed experts' rows of each expert weight (parts: [(weight, rows a expert spans, rows
        read from its start)]) uploaded first, ahead of the rest (their tokens' ids cross to
        the host, a wait for the device: only while streaming, never inside a capture, which
        waits for whole uploads first). Returns the kernel lookup the expert kernels must use:
        the unguarded one after this (the guard would wait for whole expert tensors), or
        self.k when nothing streams."""
        arenas = {id(w.owner): w.owner for w, _, _ in parts if isinstance(w.owner, WeightArena)}
        if not arenas or not any(a.streaming() for a in arenas.values()):
            return self.k
        experts = unique_ids(self.to_numpy(ids))
        for a in arenas.values():
            a.ensure([(w.ptr + int(e) * span * w.row_bytes, w.ptr + (int(e) * span + rows) * w.row_bytes)
                      for w, span, rows in parts if w.owner is a for e in experts])
        for a in self._arenas.values():  # the expert kernels read nothing else from an arena
            if a.queue is None:
                a.wait()
        return self.rt.kernel

    # -- memory ------------------------------------------------------------------
    def empty(self, shape, dtype="float32"):
        if isinstance(shape, int):
            shape = (shape,)
        # while capturing, from the graph's private pool: a block freed during the capture is
        # reused later in the same capture (safe: the captured kernels run in stream order),
        # and none is handed to work outside the graph, which replays may overwrite at any time
        return DeviceArray.empty(self.pool if self._graph is None else self._graph.pool, shape, dtype)

    def zeros(self, shape, dtype="float32"):
        out = self.empty(shape, dtype)
        if out.nbytes:
            self.rt.drv.memset_d8_async(out.ptr, 0, out.nbytes, self.rt.stream)
        return out

    def write(self, dst, host):
        a = np.ascontiguousarray(host, dtype=dst.dtype)
        if a.size != dst.size:
            raise ValueError(f"write: {a.shape} into {dst.shape}")
        if a.nbytes:
            self.rt.drv.memcpy_htod_async(dst.ptr, a, self.rt.stream)
        return dst

    @staticmethod
    def _uploaded(x):
        """Wait for the weight upload when x lives in a file's arena (a 1-D weight read back or
        copied before any kernel ran: the upload thread's copies are on their own stream, which
        the runtime's stream does not wait for; kernels wait through _k_after_upload)."""
        a = getattr(x, "owner", None)
        if isinstance(a, WeightArena):
            if a.streaming():
                a.ensure_ptr(x.ptr)
            else:
                a.wait()

    def copy(self, src, out):
        self._uploaded(src)
        if src.nbytes != out.nbytes:
            raise ValueError(f"copy: {src.shape} {src.dtype} into {out.shape} {out.dtype}")
        if src.nbytes:
            self.rt.drv.memcpy_dtod_async(out.ptr, src.ptr, src.nbytes, self.rt.stream)
        return out

    def capture(self, fn):
        """Run fn() under CUDA stream capture and return (graph, fn's result): graph.launch()
        replays every kernel fn launched, with the same arguments and buffers. fn must not
        copy between host and device; what changes between replays (positions, token ids)
        belongs in device arrays created beforehand and updated before each launch()."""
        from ..cuda.graph import Graph

        for a in self._arenas.values():
            a.wait()
        self.k = self.rt.kernel
        self._att_tickets()  # made and zeroed before the capture (a capture records, runs nothing)
        self.synchronize()
        from ..cuda.core import Pool

        g = Graph(self.rt.stream.handle)
        g.pool = Pool(self.rt.drv)
        self._graph = g
        try:
            with g:
                result = fn()
        except BaseException:
            g.close()
            raise
        finally:
            self._graph = None
        return g, result

    def asarray(self, a, dtype=None):
        """numpy -> device (float32 by default; int arrays become int32)."""
        if isinstance(a, DeviceArray):
            return a
        a = np.asarray(a)
        if dtype is None:
            dtype = "int32" if a.dtype.kind in "iub" else "float32"
        a = np.ascontiguousarray(a, dtype=dtype)
        out = self.empty(a.shape, dtype)
        if a.nbytes:
            self.rt.drv.memcpy_htod_async(out.ptr, a, self.rt.stream)
        return out

    def to_numpy(self, x):
        if isinstance(x, np.ndarray):
            return x
        self._uploaded(x)
        out = np.empty(x.shape, dtype=x.dtype)
        if out.nbytes:
            self.rt.drv.memcpy_dtoh_async(out, x.ptr, self.rt.stream)
        self.rt.stream.synchronize()
        return out

    def synchronize(self):
        self.rt.stream.synchronize()

    def wait_uploads(self):
        """Until every weight arena's upload is done (a backend brought up beside the cpu
        backend is ready to take over only then: engine._late_cuda); its error, if any."""
        for a in self._arenas.values():
            a.wait()

    def uploading(self):
        """Whether a weight arena still streams (the read upload in the forward pass's order:
        MoE files, and files read from disk), its copies then holding the copy engine for
        seconds (see statefile.StateFile.load)."""
        return any(a.streaming() for a in self._arenas.values())

    def hold_uploads(self):
        """For a state import: the streaming uploads' experts nobody asked for wait until the
        returned function is called (WeightArena.hold_experts)."""
        held = [a for a in self._arenas.values() if a.hold_experts()]

        def release():
            for a in held:
                a.release_experts()
        release.held = bool(held)
        return release

    def staging_lane(self, nbytes, pinned):
        """A StagingLane (cuda/staging.py) of nbytes for the calling thread: a host buffer
        and a stream whose copies into this backend's arrays (DeviceArray.ptr) run in order."""
        from ..cuda.staging import StagingLane

        return StagingLane(self.rt, nbytes, pinned)

    def upload_stats(self):
        """How each weight arena was uploaded (mode, bytes, ms, GB/s)."""
        return [a.report() for a in self._arenas.values()]

    # -- weights -----------------------------------------------------------------
    def _arena(self, f):
        a = self._arenas.get(id(f))
        if a is None:
            a = WeightArena(self.rt, f)
            self._arenas[id(f)] = a
            self.k = self._k_after_upload
        return a

    def load_weight(self, f, name, ndim=None):
        """A tensor of GGUFFile f on the device: 2-D matrices stay quantized in the arena
        (DeviceWeight); vectors become float32 DeviceArrays."""
        t = f.tensors[name]
        arena = self._arena(f)
        shape = weight_shape(t, ndim)  # numpy order
        if len(shape) >= 2 and t.ggml_type in MM_KERNEL:
            rows = math.prod(shape[:-1])
            cols = shape[-1]
            _, blk, bsize = TYPES[type_name(t.ggml_type)]
            if t.ggml_type in IQ_KERNEL:  # their fatbin is loaded now, never inside a graph capture
                self.rt.kernel(f"get_rows_{IQ_KERNEL[t.ggml_type]}")
            return DeviceWeight(arena.ptr(t), (rows, cols), t.ggml_type, type_name(t.ggml_type),
                                cols // blk * bsize, name, arena)
        from ..quants import dequantize

        if len(shape) >= 2:
            # a block format without a kernel here (Q2_K, Q3_K): dequantized to f16 once
            rows, cols = math.prod(shape[:-1]), shape[-1]
            host = dequantize(f.tensor_data(t), t.ggml_type, t.n_elements).astype(np.float16)
            dev = self.asarray(host.reshape(rows, cols), "float16")
            self._extra_weights.append(dev)
            return DeviceWeight(dev.ptr, (rows, cols), F16, "F16", cols * 2, name, None)
        # vectors (norm weights, biases, rope factors): float32
        if t.ggml_type == F32:
            return DeviceArray(arena.ptr(t), shape, "float32", arena)

        return self.asarray(dequantize(f.tensor_data(t), t.ggml_type, t.n_elements).reshape(shape))

    # -- linear algebra ------------------------------------------------------------
    def host_weight(self, a, name):
        """A float32 host matrix [rows, cols] as an F32 weight handle on the device (small
        matrices made at load: LoRA's padded low-rank factors)."""
        a = np.ascontiguousarray(a, np.float32)
        dev = self.asarray(a, "float32")
        self._extra_weights.append(dev)
        return DeviceWeight(dev.ptr, a.shape, F32, "F32", a.shape[1] * 4, name, None)

    def weight_rows(self, w, start, n):
        if not 0 <= start and start + n <= w.shape[0]:
            raise ValueError(f"weight_rows: rows {start}..{start + n} of {w.shape[0]}")
        if isinstance(w, DeviceWeight):
            return DeviceWeight(w.ptr + start * w.row_bytes, (n, w.shape[1]), w.ggml_type, w.type_name,
                                w.row_bytes, f"{w.name}[{start}:{start + n}]", w.owner)
        return w[start:start + n]  # a float array (a weight kept as float32)

    @staticmethod
    def _as_weight(w):
        """A float32 DeviceArray [M, K] (a small matrix made from a vector, e.g. a shared-expert
        gate) as an F32 weight handle over the same memory; weight handles as they are."""
        if isinstance(w, DeviceArray) and w.ndim == 2 and w.dtype == "float32":
            return DeviceWeight(w.ptr, w.shape, F32, "F32", w.shape[1] * 4, "float32 array", w)
        return w

    @staticmethod
    def _mm_shape(x, w):
        """(M, K, N) of x [..., K] times weight w [M, K], after checking they fit."""
        if not isinstance(w, DeviceWeight):
            raise TypeError("matmul needs a DeviceWeight from load_weight")
        M, K = w.shape
        if x.shape[-1] != K:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, weight {w.name} expects {K}")
        if K % 8:
            raise ReflexError("unsupported_architecture", f"{w.name}: rows of {K} (need a multiple of 8)")
        return M, K, x.size // K

    @staticmethod
    def _mm_launch(rows, N):
        """(tokens per block, grid, block) of the matmul kernels for `rows` output rows."""
        nt = 1 if N == 1 else (4 if N <= 4 else 8)
        return nt, ((rows + MM_ROWS - 1) // MM_ROWS, (N + nt - 1) // nt, 1), (32 * MM_ROWS, 1, 1)

    def _use_mmt(self, N):
        """Whether a matvec of N tokens (not taking the tensor-core kernels) takes matvec_nt.cuh's."""
        return self.mmnt and 1 < N < MMA_MIN_N

    @staticmethod
    def _mmt_launch(rows, N, rows_per_block=MMT_ROWS):
        """(tokens per block, grid, block) of the mmt* kernels for `rows` rows (or row pairs)."""
        return MMT_NT, (-(-rows // rows_per_block), -(-N // MMT_NT), 1), (MMT_THREADS, 1, 1)

    def _use_mma(self, w, N):
        """Whether x of N rows times w takes the tensor-core kernels (f16 inputs, f32 sums)."""
        return self.mma and N >= self.mma_min_n and w.ggml_type in MMA_FORMATS

    def _sm_count(self):
        n = getattr(self, "_sms", None)
        if n is None:
            drv = self.rt.drv
            n = self._sms = self.rt.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        return n

    def _mma_splits(self, M, N, K, nw):
        """How many blocks share K (grid z) for an [M, K] weight (nw of them: 1, or 2 for the
        gated unit) times N tokens: as many as fill the SMs with MMA_BLOCKS_PER_SM blocks each
        (one wave), at most one per slice; every split gets ceil(slices / S) slices, so S is
        trimmed until none is empty."""
        tiles = -(-M // MMA_BM) * -(-N // MMA_BN)
        nk = -(-K // MMA_BK[nw])
        s = max(1, min(MMA_BLOCKS_PER_SM[nw] * self._sm_count() // tiles, nk))
        per = -(-nk // s)
        return -(-nk // per)

    def _mma_x16(self, x):
        """x (float32, size a multiple of 8) as f16: the tensor-core kernels' X operand."""
        xh = self.empty((x.size,), "float16")
        blocks = min(-(-x.size // (4 * EW_BLOCK)), 8 * self._sm_count())
        self.k("mma_x_f16")((blocks, 1, 1), (EW_BLOCK, 1, 1), x=x.ptr, y=xh.ptr, n=x.size)
        return xh

    def _mma(self, ws, xh, out, K, M, N, mode):
        """out [N, M] = ws[0] xh^T (mode 1: +=), or for two weights act(Wg xh^T) * (Wu xh^T)
        (mode 0 silu, 1 tanh gelu), xh from _mma_x16. Split K: the blocks' partial sums go to
        a scratch P [S][nw][N][M] and mma_reduce adds them in order (deterministic) and
        applies the epilogue."""
        nw = len(ws)
        S = self._mma_splits(M, N, K, nw)
        grid = (-(-M // MMA_BM), -(-N // MMA_BN), S)
        P = self.empty((S * nw * N * M,)) if S > 1 else None
        t, block, rb, p = MM_KERNEL[ws[0].ggml_type], (MMA_THREADS, 1, 1), ws[0].row_bytes, P.ptr if S > 1 else 0
        kmode = mode | (MMA_WIDE if self._wide_ok(ws[0], *(w.ptr for w in ws)) else 0)
        if nw == 1:
            self.k(f"mma_{t}")(grid, block, W=ws[0].ptr, X=xh.ptr, Y=out.ptr, K=K, M=M, N=N, rb=rb, acc=kmode, P=p)
        else:
            self.k(f"mmaglu_{t}")(grid, block, Wg=ws[0].ptr, Wu=ws[1].ptr, X=xh.ptr, Y=out.ptr, K=K, M=M, N=N, rb=rb,
                                  act=kmode, P=p)
        if S > 1:
            blocks = min(-(-(N * M) // EW_BLOCK), 8 * self._sm_count())
            self.k("mma_reduce")((blocks, 1, 1), (EW_BLOCK, 1, 1), P=P.ptr, Y=out.ptr, S=S, NW=nw, NM=N * M,
                                 mode=mode)
        return out

    def _mv_ok(self, x, ws):
        """Whether one token x times the weights ws (one format) can take matvec.cuh's kernels."""
        t = ws[0].ggml_type
        return (self.matvec and t in MV_KERNEL and x.ptr % 16 == 0
                and all(w.ggml_type == t and w.ptr % MV_ALIGN[t] == 0 and w.row_bytes % MV_ALIGN[t] == 0
                        for w in ws))

    def _mv(self, kind, x, ws, K, rows):
        """(kernel, grid, block) of matvec.cuh's `kind` ("mv", "mvn", "mvglu") when one token x
        times the weights ws (width K, `rows` output rows in all) takes it, else None (switch
        off, another format, misaligned, or mv_pick prefers the older kernels there)."""
        if not self._mv_ok(x, ws):
            return None
        v = self.mv_variant or mv_pick(ws[0].ggml_type, K, rows, kind)
        return (self.k(f"{kind}{v}_{MV_KERNEL[ws[0].ggml_type]}"), *mv_grid(v, rows)) if v else None

    def matmul(self, x, w, out=None, accumulate=False, xh=None):
        """x [..., K] float32 times a weight [M, K] (or a float32 array [M, K]) -> [..., M] (x @ w.T).
        xh: x as f16 from _mma_x16 when the caller has it (matmul_n: q, k, v share one)."""
        w = self._as_weight(w)
        M, K, N = self._mm_shape(x, w)
        if out is None:
            if accumulate:
                raise ValueError("matmul: accumulate=True needs out")
            out = self.empty(x.shape[:-1] + (M,))
        if self._use_mma(w, N):
            return self._mma((w,), xh if xh is not None else self._mma_x16(x), out, K, M, N,
                             1 if accumulate else 0)
        if N == 1 and (mv := self._mv("mv", x, (w,), K, M)):
            k, grid, block = mv
            k(grid, block, Wt=w.ptr, X=x.ptr, Y=out.ptr, K=K, M=M, rb=w.row_bytes, acc=1 if accumulate else 0)
            return out
        if N == 1 and M <= MM_SPLIT_ROWS and fusion_on():  # one token, few rows: a block per row
            self.k(f"mmsk1_{MM_KERNEL[w.ggml_type]}")((M, 1, 1), (32 * MM_ROWS, 1, 1), W=w.ptr, X=x.ptr, Y=out.ptr,
                                                      K=K, rb=w.row_bytes, acc=1 if accumulate else 0)
            return out
        if self._use_mmt(N):
            nt, grid, block = self._mmt_launch(M, N)
            name = f"mmt{nt}_{MM_KERNEL[w.ggml_type]}"
        else:
            nt, grid, block = self._mm_launch(M, N)
            name = f"mm{nt}_{MM_KERNEL[w.ggml_type]}"
        self.k(name)(grid, block, W=w.ptr, X=x.ptr, Y=out.ptr, K=K, M=M, N=N, rb=w.row_bytes,
                     acc=1 if accumulate else 0)
        return out

    def matmul_n(self, x, ws):
        """[x @ w.T for w in ws] (1-3 weights of one width): one launch over the rows of all
        the weights that share a block format (a mixed q/k/v, e.g. Q4_K q and k with a Q6_K v,
        takes one launch per format)."""
        check_matmul_n(ws)
        for w in ws:
            self._mm_shape(x, w)
        by_type = {}
        for i, w in enumerate(ws):
            by_type.setdefault(w.ggml_type, []).append(i)
        outs = [None] * len(ws)
        N = x.size // ws[0].shape[1]
        xh = None
        for idx in by_type.values():
            if len(idx) == 1 or self._use_mma(ws[idx[0]], N):  # tensor-core tiles: one launch each
                if xh is None and self._use_mma(ws[idx[0]], N):
                    xh = self._mma_x16(x)  # converted once for all the weights
                for i in idx:
                    outs[i] = self.matmul(x, ws[i], xh=xh)
                continue
            group = [ws[i] for i in idx]
            ys = [self.empty(x.shape[:-1] + (w.shape[0],)) for w in group]
            pad = [0] * (3 - len(group))
            W = [w.ptr for w in group] + pad
            Y = [y.ptr for y in ys] + pad
            Ms = [w.shape[0] for w in group] + pad
            K = group[0].shape[1]
            N = x.size // K
            if N == 1 and (mv := self._mv("mvn", x, group, K, sum(Ms))):  # mvn without the norm
                k, grid, block = mv
                k(grid, block, k.head(W0=W[0], W1=W[1], W2=W[2], X=x.ptr, nw=0), eps=0.0, Y0=Y[0], Y1=Y[1], Y2=Y[2],
                  K=K, M0=Ms[0], M1=Ms[1], M2=Ms[2], rb=group[0].row_bytes, norm=0)
                for i, y in zip(idx, ys):
                    outs[i] = y
                continue
            if self._use_mmt(N):
                nt, grid, block = self._mmt_launch(sum(Ms), N)
                name = f"mmtn{nt}_{MM_KERNEL[group[0].ggml_type]}"
            else:
                nt, grid, block = self._mm_launch(sum(Ms), N)
                name = f"mmn{nt}_{MM_KERNEL[group[0].ggml_type]}"
            self.k(name)(grid, block, W0=W[0], W1=W[1], W2=W[2], X=x.ptr, Y0=Y[0], Y1=Y[1], Y2=Y[2], K=K, M0=Ms[0],
                         M1=Ms[1], M2=Ms[2], N=N, rb=group[0].row_bytes)
            for i, y in zip(idx, ys):
                outs[i] = y
        return outs

    def matmul_glu(self, x, w_gate, w_up, act="silu"):
        """act(x @ w_gate.T) * (x @ w_up.T), act silu or tanh gelu: one launch when both
        weights share a block format, else two matmuls and swiglu / geglu."""
        check_glu(w_gate, w_up, act)
        M, K, N = self._mm_shape(x, w_gate)
        self._mm_shape(x, w_up)
        if w_gate.ggml_type != w_up.ggml_type:
            g, u = self.matmul(x, w_gate), self.matmul(x, w_up)
            return self.swiglu(g, u) if act == "silu" else self.geglu(g, u)
        out = self.empty(x.shape[:-1] + (M,))
        if self._use_mma(w_gate, N):
            return self._mma((w_gate, w_up), self._mma_x16(x), out, K, M, N, 0 if act == "silu" else 1)
        if N == 1 and (mv := self._mv("mvglu", x, (w_gate, w_up), K, M)):  # mvglu without the norm
            k, grid, block = mv
            k(grid, block, Wg=w_gate.ptr, Wu=w_up.ptr, X=x.ptr, nw=0, eps=0.0, Y=out.ptr, K=K, M=M,
              rb=w_gate.row_bytes, act=0 if act == "silu" else 1, norm=0)
            return out
        if self._use_mmt(N):  # a block: MMT_ROWS / 2 rows of gate and the same rows of up
            nt, grid, block = self._mmt_launch(M, N, MMT_ROWS // 2)
            name = f"mmtglu{nt}_{MM_KERNEL[w_gate.ggml_type]}"
        else:
            nt, grid, block = self._mm_launch(M, N)
            name = f"mmglu{nt}_{MM_KERNEL[w_gate.ggml_type]}"
        self.k(name)(grid, block, Wg=w_gate.ptr, Wu=w_up.ptr, X=x.ptr, Y=out.ptr, K=K, M=M, N=N, rb=w_gate.row_bytes,
                     act=0 if act == "silu" else 1)
        return out

    # -- fused decode ops (base.FUSED_OPS; models reach them through base's functions) --------
    def rms_norm_matmul_n(self, x, w_norm, eps, ws):
        """matmul_n(rms_norm(x, w_norm, eps), ws). One token: one launch per block format
        (mmnorm1_*), each warp folding the norm into its row's dot product. More tokens:
        the two ops."""
        check_matmul_n(ws)
        for w in ws:
            self._mm_shape(x, w)
        K = x.shape[-1]
        if x.size != K or (w_norm is not None and w_norm.shape != (K,)):
            return self.matmul_n(self.rms_norm(x, w_norm, eps), ws)
        by_type = {}
        for i, w in enumerate(ws):
            by_type.setdefault(w.ggml_type, []).append(i)
        outs = [None] * len(ws)
        for idx in by_type.values():
            group = [ws[i] for i in idx]
            ys = [self.empty(x.shape[:-1] + (w.shape[0],)) for w in group]
            pad = [0] * (3 - len(group))
            W = [w.ptr for w in group] + pad
            Y = [y.ptr for y in ys] + pad
            Ms = [w.shape[0] for w in group] + pad
            nw = w_norm.ptr if w_norm is not None else 0
            mv = self._mv("mvn", x, group, K, sum(Ms)) if w_norm is None or w_norm.ptr % 16 == 0 else None
            if mv:  # mvn, the norm folded in
                k, grid, block = mv
                k(grid, block, k.head(W0=W[0], W1=W[1], W2=W[2], X=x.ptr, nw=nw), eps=float(eps), Y0=Y[0],
                  Y1=Y[1], Y2=Y[2], K=K, M0=Ms[0], M1=Ms[1], M2=Ms[2], rb=group[0].row_bytes, norm=1)
                for i, y in zip(idx, ys):
                    outs[i] = y
                continue
            split = sum(Ms) <= MM_SPLIT_ROWS
            grid = (sum(Ms) if split else (sum(Ms) + MM_ROWS - 1) // MM_ROWS, 1, 1)
            kern = self.k(f"mmnorm1_{MM_KERNEL[group[0].ggml_type]}")
            kern(grid, (32 * MM_ROWS, 1, 1), kern.head(W0=W[0], W1=W[1], W2=W[2], X=x.ptr, nw=nw), eps=float(eps),
                 Y0=Y[0], Y1=Y[1], Y2=Y[2], K=K, M0=Ms[0], M1=Ms[1], M2=Ms[2], rb=group[0].row_bytes,
                 split=1 if split else 0)
            for i, y in zip(idx, ys):
                outs[i] = y
        return outs

    def rms_norm_matmul_glu(self, x, w_norm, eps, w_gate, w_up, act="silu"):
        """matmul_glu(rms_norm(x, w_norm, eps), w_gate, w_up, act): one launch (mmgnorm1_*)
        for one token with gate and up of one block format, else the two ops."""
        check_glu(w_gate, w_up, act)
        M, K, N = self._mm_shape(x, w_gate)
        self._mm_shape(x, w_up)
        if N != 1 or w_gate.ggml_type != w_up.ggml_type or (w_norm is not None and w_norm.shape != (K,)):
            return self.matmul_glu(self.rms_norm(x, w_norm, eps), w_gate, w_up, act=act)
        out = self.empty(x.shape[:-1] + (M,))
        mv = self._mv("mvglu", x, (w_gate, w_up), K, M) if w_norm is None or w_norm.ptr % 16 == 0 else None
        if mv:
            k, grid, block = mv
            k(grid, block, Wg=w_gate.ptr, Wu=w_up.ptr, X=x.ptr, nw=w_norm.ptr if w_norm is not None else 0,
              eps=float(eps), Y=out.ptr, K=K, M=M, rb=w_gate.row_bytes, act=0 if act == "silu" else 1, norm=1)
            return out
        split = M <= MM_SPLIT_ROWS
        self.k(f"mmgnorm1_{MM_KERNEL[w_gate.ggml_type]}")(
            (M if split else (M + MM_ROWS - 1) // MM_ROWS, 1, 1), (32 * MM_ROWS, 1, 1), Wg=w_gate.ptr, Wu=w_up.ptr,
            X=x.ptr, nw=w_norm.ptr if w_norm is not None else 0, eps=float(eps), Y=out.ptr, K=K, M=M,
            rb=w_gate.row_bytes, act=0 if act == "silu" else 1, split=1 if split else 0)
        return out

    def qk_rope_kv_store(self, q, k, v, q_norm, k_norm, eps, pos, k_cache, v_cache, slots, *, norm=True,
                         n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None, neox=False,
                         mscale=1.0):
        """base.qk_rope_kv_store in one launch: q and k [N, H, hd] normed (when norm) and
        rotated in place, k and v written to the f16 K/V [Hkv, n_slots, d] at slots."""
        N, Hq, hd = q.shape
        Nk, Hkv, hdk = k.shape
        Nv, Hv, dv = v.shape
        n_rot = hd if n_rot is None else n_rot
        if (Nk, hdk) != (N, hd) or (Nv, Hv) != (N, Hkv) or n_rot % 2 or not 0 < n_rot <= hd:
            raise ValueError(f"qk_rope_kv_store: q {q.shape}, k {k.shape}, v {v.shape}, n_rot {n_rot}")
        if k_cache.shape[0] != Hkv or k_cache.shape[2] != hd or v_cache.shape[:2] != k_cache.shape[:2] \
                or v_cache.shape[2] != dv:
            raise ValueError(f"qk_rope_kv_store: K/V {k_cache.shape}, {v_cache.shape} for k {k.shape}, v {v.shape}")
        for nw in (q_norm, k_norm):
            if norm and nw is not None and nw.shape != (hd,):
                raise ValueError(f"qk_rope_kv_store: norm weight {nw.shape} for head dim {hd}")
        pos, slots = self.positions(pos), self.positions(slots)
        rows = N * (Hq + Hkv)
        if rows == 0:
            return q, k
        kern = self.k("qk_rope_kv_store_f32")
        kern(((rows + QK_ROPE_ROWS - 1) // QK_ROPE_ROWS, 1, 1), (32 * QK_ROPE_ROWS, 1, 1),
             kern.head(q=q.ptr, k=k.ptr, v=v.ptr, qw=q_norm.ptr if norm and q_norm is not None else 0,
                       kw=k_norm.ptr if norm and k_norm is not None else 0, kc=k_cache.ptr, vc=v_cache.ptr, pos=pos.ptr,
                       slots=slots.ptr, N=N),
             Hq=Hq, Hkv=Hkv, hd=hd, dv=dv, ctx=k_cache.shape[1], norm=1 if norm else 0, eps=float(eps), n_rot=n_rot,
             base=float(base), freq_scale=float(freq_scale), ff=freq_factors.ptr if freq_factors is not None else 0,
             neox=1 if neox else 0, mscale=float(mscale))
        return q, k

    def residual_add(self, x, y, w, eps, *, norm=True, scale=1.0, out_scale=1.0):
        """base.residual_add in one launch (residual_add_f32): x = (x + scale * rms_norm(y, w,
        eps)) * out_scale (y itself when not norm), in place on x [rows, dim]."""
        self._f32("residual_add", x, y, *([w] if norm and w is not None else []))
        dim = x.shape[-1]
        if y.shape != x.shape or (norm and w is not None and w.shape != (dim,)):
            raise ValueError(f"residual_add: x {x.shape}, y {y.shape}, w {None if w is None else w.shape}")
        rows = x.size // dim if dim else 0
        if rows:
            threads = 1024 if dim >= 4096 else (256 if dim >= 512 else 64)
            self.k("residual_add_f32")((rows, 1, 1), (threads, 1, 1), x=x.ptr, y=y.ptr,
                                       w=w.ptr if norm and w is not None else 0, dim=dim, norm=1 if norm else 0,
                                       eps=float(eps), scale=float(scale), out_scale=float(out_scale))
        return x

    def moe(self, x, router, w_gate, w_up, w_down, n_used, *, gating="softmax", norm=True, scale=1.0,
            selection_bias=None, act="silu", groups=None, logits=None, expert_scale=None, router_bias=None,
            gate_bias=None, up_bias=None, down_bias=None, weight_before=False):
        """base.py's moe on the device, with no host round trip (so a graph can hold it): the
        routing kernel writes each token's expert ids and weights to device buffers, then one
        launch computes act(gate) * up of every (token, chosen expert) pair [N*k, F] and one
        the down projections summed over a token's experts with their weights, in slot order
        (deterministic). Only the chosen experts' blocks are read. REFLEX_CUDA_MOE=host routes
        on the host instead (the earlier path, for A/B; it waits for the device, so models are
        then not captured: `moe_capturable`). gpt-oss (expert biases, act swiglu_oai): the gate
        and up products apart, then archops.cuh's biased clamped SwiGLU, its down biases after the
        weighted sum; Llama 4 (weight_before): each pair's input weighted first (archops.cuh)."""
        extra = dict(router_bias=router_bias, gate_bias=gate_bias, up_bias=up_bias, down_bias=down_bias,
                     weight_before=weight_before)
        if self._moe_host_mode:
            return self._moe_host(x, router, w_gate, w_up, w_down, n_used, gating=gating, norm=norm,
                                  scale=scale, selection_bias=selection_bias, act=act, groups=groups,
                                  logits=logits, expert_scale=expert_scale, **extra)
        if logits is None:
            logits = self.matmul(x, router)
        if router_bias is not None:
            logits = self.add(logits, router_bias)
        N, K = x.shape
        E = logits.shape[-1]
        F, D = w_gate.shape[0] // E // (2 if w_up is None else 1), w_down.shape[0] // E
        if act not in ("silu", "gelu", "swiglu_oai"):
            raise ValueError(f"moe: act must be 'silu', 'gelu' or 'swiglu_oai', not {act!r}")
        if (gate_bias is not None or up_bias is not None) and act != "swiglu_oai":
            raise ValueError(f"moe: expert gate/up biases with act {act!r} (only swiglu_oai takes them)")
        parts = 2 if w_up is None else 1
        if (w_gate.shape != (parts * E * F, K) or (w_up is not None and w_up.shape != (E * F, K))
                or w_down.shape != (E * D, F) or logits.shape != (N, E)):
            raise ValueError(f"moe: x {x.shape}, logits {logits.shape}, gate {w_gate.shape}, "
                             f"up {None if w_up is None else w_up.shape}, down {w_down.shape}")
        for w in (w_gate, w_down) + (() if w_up is None else (w_up,)):
            if not isinstance(w, DeviceWeight):
                raise TypeError("moe needs DeviceWeights from load_weight")
        if K % 8 or F % 8:
            raise ReflexError("unsupported_architecture", f"{w_gate.name}: experts of {F} x {K} "
                              "(need multiples of 8)")
        ids, wts = self.moe_route(logits, n_used, gating=gating, norm=norm, scale=scale,
                                  selection_bias=selection_bias, groups=groups, expert_scale=expert_scale)
        k = ids.shape[1]
        out = self.empty((N, D))
        if N == 0:
            return out
        if weight_before:  # Llama 4: pair p's input is x[p / k] * wts[p]; its output summed unweighted
            xw, ones = self.empty((N * k, K)), self.empty((N * k,))
            self.k("moe_weight_input_f32")(_ew_grid(N * k * K), (EW_BLOCK, 1, 1), X=x.ptr, wts=wts.ptr, X2=xw.ptr,
                                           ones=ones.ptr, n=N * k * K, K=K, k=k)
            x, wts, x_div = xw, ones, 1
        else:
            x_div = k
        if w_up is None:  # expert e: gate rows 2eF..2eF+F-1, its up rows right after
            wg_ptr, wu_ptr, estride = w_gate.ptr, w_gate.ptr + F * w_gate.row_bytes, 2 * F
            same = True
        else:
            wg_ptr, wu_ptr, estride = w_gate.ptr, w_up.ptr, F
            same = w_gate.ggml_type == w_up.ggml_type and w_gate.row_bytes == w_up.row_bytes
        # expert rows: gate (and its up rows after it when fused), up, down
        parts = [(w_gate, estride, estride), (w_down, D, D)] + ([] if w_up is None else [(w_up, F, F)])
        kx = self._moe_experts_ready(ids, parts)
        for b, shape in ((gate_bias, (E, F)), (up_bias, (E, F)), (down_bias, (E, D))):
            if b is not None and (b.shape != shape or b.dtype != "float32"):
                raise ValueError(f"moe: expert biases of {b.dtype} {b.shape}, expected float32 {shape}")
        if same and self._moe_mma_takes(N, k, E, w_gate, w_down):
            self._moe_grouped(x, ids, wts, out, wg_ptr, wu_ptr, estride, w_gate, w_down, F, D,
                              {"silu": 0, "gelu": 1, "swiglu_oai": 2}[act], kx, x_div=x_div, gate_bias=gate_bias,
                              up_bias=up_bias)
        else:
            self._moe_pairs(x, ids, wts, out, wg_ptr, wu_ptr, estride, w_gate, w_up, w_down, F, D, act, kx,
                            x_div, same, gate_bias, up_bias)
        if down_bias is not None:
            self.k("moe_down_bias_f32")(_ew_grid(N * D), (EW_BLOCK, 1, 1), Y=out.ptr, bd=down_bias.ptr, ids=ids.ptr,
                                        wts=wts.ptr, n=N * D, D=D, k=k)
        return out

    def _moe_pairs(self, x, ids, wts, out, wg_ptr, wu_ptr, estride, w_gate, w_up, w_down, F, D, act, kx, x_div,
                   same, gate_bias, up_bias):
        """moe's per-pair form (decode, and prefill off the tensor cores): act(gate) * up of each
        (token, chosen expert) pair [N*k, F] (one moe_glu launch, or the two products apart and
        the unit after them: gate/up of two formats, gpt-oss's biased swiglu_oai), then the down
        projections summed over a token's experts with their weights (moe_down, or with
        moe_down_split a warp per (pair, row) and moe_wsum_f32's slot-order sum: the same bits).
        Experts in matvec.cuh's formats take moe_mv.cuh's moe_mvglu / moe_mvdown instead (see
        MOE_MV_GLU). x [N * k / x_div, K]: row p / x_div is pair p's input."""
        N, D = out.shape
        k = ids.shape[1]
        K = x.shape[1]
        grid = (N * k, (F + MM_ROWS - 1) // MM_ROWS, 1)
        block = (32 * MM_ROWS, 1, 1)
        if same and act != "swiglu_oai" and self._moe_mv_ok(N * k, w_gate, (wg_ptr, wu_ptr), x):
            h = self.empty((N * k, F))
            v = self.moe_mv_variant or moe_mv_pick(w_gate.ggml_type)
            kx(f"moe_mvglu{v}_{MV_KERNEL[w_gate.ggml_type]}")(
                *moe_mv_grid(v, F, N * k), Wg=wg_ptr, Wu=wu_ptr, X=x.ptr, ids=ids.ptr, Y=h.ptr, K=K, F=F,
                x_div=x_div, es=estride, rb=w_gate.row_bytes, act=0 if act == "silu" else 1)
            self.moe_mv_launches += 1
        elif same and act != "swiglu_oai":
            h = self.empty((N * k, F))
            kx(f"moe_glu_{MM_KERNEL[w_gate.ggml_type]}")(grid, block, Wg=wg_ptr, Wu=wu_ptr, X=x.ptr, ids=ids.ptr,
                                                         Y=h.ptr, K=K, F=F, k=x_div, es=estride, rb=w_gate.row_bytes,
                                                         act=0 if act == "silu" else 1)
        else:
            g, u = self.empty((N * k, F)), self.empty((N * k, F))
            for w, ptr, y in ((w_gate, wg_ptr, g), (w_up if w_up is not None else w_gate, wu_ptr, u)):
                kx(f"moe_mm_{MM_KERNEL[w.ggml_type]}")(grid, block, W=ptr, X=x.ptr, ids=ids.ptr, Y=y.ptr, K=K,
                                                       M=F, x_div=x_div, es=estride, rb=w.row_bytes)
            if act == "swiglu_oai":
                h = self.empty((N * k, F))
                self.k("moe_swiglu_oai_f32")(_ew_grid(N * k * F), (EW_BLOCK, 1, 1), G=g.ptr, U=u.ptr,
                                             bg=gate_bias.ptr if gate_bias is not None else 0,
                                             bu=up_bias.ptr if up_bias is not None else 0, ids=ids.ptr, H=h.ptr,
                                             n=N * k * F, F=F, alpha=OAI_ALPHA, limit=OAI_LIMIT)
            else:
                h = self.swiglu(g, u) if act == "silu" else self.geglu(g, u)
        if self.moe_down_split:  # a warp per (pair, row), then the slot-order sum: the same bits
            y = self.empty((N * k, D))
            kx(f"moe_mm_{MM_KERNEL[w_down.ggml_type]}")((N * k, (D + MM_ROWS - 1) // MM_ROWS, 1), block, W=w_down.ptr,
                                                       X=h.ptr, ids=ids.ptr, Y=y.ptr, K=F, M=D, x_div=1, es=D,
                                                       rb=w_down.row_bytes)
            self.k("moe_wsum_f32")(_ew_grid(N * D), (EW_BLOCK, 1, 1), Y=y.ptr, wts=wts.ptr, out=out.ptr, N=N, D=D, k=k)
            return
        if self._moe_mv_ok(N, w_down, (w_down.ptr,), h):
            kx(f"moe_mvdown_{MV_KERNEL[w_down.ggml_type]}")(
                (-(-D // MOE_MVD_R), N, 1), (32 * min(k, MOE_MVD_WARPS), 1, 1), W=w_down.ptr, H=h.ptr, ids=ids.ptr,
                wts=wts.ptr, Y=out.ptr, F=F, D=D, k=k, es=D, rb=w_down.row_bytes)
            self.moe_mv_launches += 1
            return
        kx(f"moe_down_{MM_KERNEL[w_down.ggml_type]}")(
            (N, (D + MM_ROWS - 1) // MM_ROWS, 1), block, W=w_down.ptr, H=h.ptr, ids=ids.ptr, wts=wts.ptr, Y=out.ptr,
            F=F, D=D, k=k, es=D, rb=w_down.row_bytes)

    def _moe_mv_ok(self, rows, w, ptrs, x):
        """Whether the per-pair form's expert weight w (expert blocks at ptrs) over x takes
        moe_mv.cuh (`rows` pairs or tokens along the grid's y): REFLEX_MATVEC=new, a format of
        matvec.cuh, the pointers and rows aligned for its loads, x 16-byte aligned."""
        t = w.ggml_type
        return (self.matvec and t in MV_KERNEL and 0 < rows <= MOE_MV_MAX_PAIRS and x.ptr % 16 == 0
                and w.row_bytes % MV_ALIGN[t] == 0 and all(p % MV_ALIGN[t] == 0 for p in ptrs))

    def _moe_mma_takes(self, N, k, E, w_gate, w_down):
        """Whether a moe of N tokens (k experts each of E) runs as grouped tensor-core GEMMs:
        sm_80+, REFLEX_MOE_MMA not 0, N >= moe_mma_min_n, gate/up and down in MMA_FORMATS,
        a tile grid within CUDA's 65535 blocks along y, and one warp's counts of E experts in
        moe_group_i32's shared memory."""
        P = N * k
        return (self.moe_mma and N >= self.moe_mma_min_n and w_gate.ggml_type in MMA_FORMATS
                and w_down.ggml_type in MMA_FORMATS and P // MMA_BN + min(E, P) <= 65535
                and 4 * (3 * E + 2) <= MOE_GROUP_SHARED)

    def _wide_ok(self, w, *ptrs):
        """Whether the tensor-core kernels read weight w (from ptrs) with DeqWide's wide loads:
        mma_wide, a format DeqWide reads, and tensors that start aligned as it needs (Q4_K /
        Q5_K blocks, 144 / 176 bytes, are then all 16-byte aligned; Q6_K's aligned words around
        a run stay inside the tensor)."""
        a = WIDE_ALIGN.get(w.ggml_type)
        ok = bool(self.mma_wide and a and not any(p % a for p in ptrs))
        self.wide_launches += ok
        return ok

    def _moe_flags(self, w, *ptrs):
        """mma_moe / mmaglu_moe's flags for weight w read from ptrs: MOE_SKIP (moe_skip), MOE_WIDE."""
        return (MOE_SKIP if self.moe_skip else 0) | (MOE_WIDE if self._wide_ok(w, *ptrs) else 0)

    def _moe_grouped(self, x, ids, wts, out, wg_ptr, wu_ptr, estride, w_gate, w_down, F, D, act, kx=None, *,
                     x_div=None, gate_bias=None, up_bias=None):
        """moe's prefill form (see MOE_MMA_MIN_N): the pairs grouped by expert (moe_group_i32),
        H [P, F] f16 = act(gate) * up of each group's gathered tokens in group order
        (mmaglu_moe_*), Y [P, D] = down of H's rows stored at their pairs (mma_moe_*), out [N, D]
        = each token's k rows of Y weighted, in slot order (moe_wsum_f32). Launch arguments do
        not depend on the routing (the tile grid is sized for the worst case), so a graph holds it.
        act 2: gpt-oss's swiglu_oai with its gate/up biases [E, F] in mmaglu_moe's epilogue;
        x_div (default k): pair p's input is x row p / x_div (1: Llama 4's weighted pair rows)."""
        N, k = ids.shape
        K = x.shape[1]
        x_div = k if x_div is None else x_div
        E = w_down.shape[0] // D
        P = N * k
        tmax = P // MMA_BN + min(E, P)
        warps = max(1, min(MOE_GROUP_WARPS, (MOE_GROUP_SHARED // 4 - 2 * (E + 1)) // E))
        order, eoff = self.empty((P,), "int32"), self.empty((E + 1,), "int32")
        tiles = self.empty((1 + 2 * tmax,), "int32")
        self.k("moe_group_i32")((1, 1, 1), (32 * warps, 1, 1), ids=ids.ptr, order=order.ptr, eoff=eoff.ptr,
                                tiles=tiles.ptr, P=P, E=E, BN=MMA_BN, shared=4 * (warps * E + 2 * (E + 1)))
        xh = self._mma_x16(x)
        h = self.empty((P, F), "float16")
        block = (MMA_THREADS, 1, 1)
        kx = kx or self.k  # (the expert kernels' lookup: see _moe_experts_ready)
        glu = kx(f"mmaglu_moe_{MM_KERNEL[w_gate.ggml_type]}")
        glu((-(-F // MMA_BM), tmax, 1), block,
            glu.head(Wg=wg_ptr, Wu=wu_ptr, X=xh.ptr, order=order.ptr, eoff=eoff.ptr, tiles=tiles.ptr, H=h.ptr,
                     bg=gate_bias.ptr if gate_bias is not None else 0, bu=up_bias.ptr if up_bias is not None else 0),
            K=K, M=F, k=x_div, es=estride, rb=w_gate.row_bytes, act=act, alpha=OAI_ALPHA, limit=OAI_LIMIT,
            flags=self._moe_flags(w_gate, wg_ptr, wu_ptr))
        y = self.empty((P, D))
        kx(f"mma_moe_{MM_KERNEL[w_down.ggml_type]}")(
            (-(-D // MMA_BM), tmax, 1), block, W=w_down.ptr, X=h.ptr, order=order.ptr, eoff=eoff.ptr,
            tiles=tiles.ptr, Y=y.ptr, K=F, M=D, es=D, rb=w_down.row_bytes, flags=self._moe_flags(w_down, w_down.ptr))
        self.k("moe_wsum_f32")(_ew_grid(N * D), (EW_BLOCK, 1, 1), Y=y.ptr, wts=wts.ptr, out=out.ptr, N=N, D=D, k=k)
        self.moe_mma_launches += 1
        return out

    def moe_route(self, logits, n_used, *, gating="softmax", norm=True, scale=1.0, selection_bias=None,
                  groups=None, expert_scale=None):
        """The routing of moe on the device: (ids int32 [N, n_used], weights float32 [N, n_used])
        device arrays, as base.moe_route computes them (weights also times expert_scale[id])."""
        if gating not in ("softmax", "sigmoid", "softmax_weight"):
            raise ValueError(f"moe: gating must be softmax, sigmoid or softmax_weight, not {gating!r}")
        N, E = logits.shape
        k = int(n_used)
        if not 1 <= k <= E:
            raise ValueError(f"moe: {k} experts used of {E}")
        G, G_used = (int(groups[0]), int(groups[1])) if groups is not None and groups[0] > 1 else (0, 0)
        if G and (E % G or not 1 <= G_used):
            raise ValueError(f"moe: {E} experts in {G} groups, {G_used} used")
        for v in (selection_bias, expert_scale):
            if v is not None and (v.shape != (E,) or v.dtype != "float32"):
                raise ValueError(f"moe: a float32 [{E}] vector, not {v.dtype} {v.shape}")
        shared = 4 * (2 * E + G) + E + G
        if shared > MOE_ROUTE_SHARED:
            raise ReflexError("unsupported_architecture", f"moe: {E} experts in {G} groups exceed the "
                              "routing kernel's shared memory (REFLEX_CUDA_MOE=host routes on the host)")
        ids, wts = self.empty((N, k), "int32"), self.empty((N, k))
        gid = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}[gating]
        if N and self.moe_route_warp and not G and E <= MOE_ROUTE_WARP_MAXE:
            self.k("moe_route_warp_f32")((-(-N // MOE_ROUTE_WARP_TOKENS), 1, 1), (32 * MOE_ROUTE_WARP_TOKENS, 1, 1),
                                         logits=logits.ptr,
                                         bias=selection_bias.ptr if selection_bias is not None else 0,
                                         escale=expert_scale.ptr if expert_scale is not None else 0, ids=ids.ptr,
                                         wts=wts.ptr, N=N, E=E, k=k, gating=gid, norm=1 if norm else 0,
                                         scale=1.0 if scale in (0.0, 1.0) else float(scale))
        elif N:
            self.k("moe_route_f32")((N, 1, 1), (MOE_ROUTE_THREADS, 1, 1), logits=logits.ptr,
                                    bias=selection_bias.ptr if selection_bias is not None else 0,
                                    escale=expert_scale.ptr if expert_scale is not None else 0, ids=ids.ptr,
                                    wts=wts.ptr, E=E, k=k, gating=gid,
                                    norm=1 if norm else 0, scale=1.0 if scale in (0.0, 1.0) else float(scale), G=G,
                                    G_used=G_used, shared=shared)
        return ids, wts

    def _moe_host(self, x, router, w_gate, w_up, w_down, n_used, *, gating="softmax", norm=True, scale=1.0,
                  selection_bias=None, act="silu", groups=None, logits=None, expert_scale=None, router_bias=None,
                  gate_bias=None, up_bias=None, down_bias=None, weight_before=False):
        """REFLEX_CUDA_MOE=host: routed on the host (the router's logits cross, N x E floats),
        then each token's selected experts through the quantized matmul kernels on views of the
        expert tensors. It waits for the device, so it cannot run inside a captured graph."""
        if self._graph is not None:
            raise RuntimeError("moe: REFLEX_CUDA_MOE=host cannot run inside a captured graph")
        if logits is None:
            logits = self.matmul(x, router)
        if router_bias is not None:
            logits = self.add(logits, router_bias)
        E = logits.shape[-1]
        F, D = w_gate.shape[0] // E // (2 if w_up is None else 1), w_down.shape[0] // E
        top, w = moe_route(self.to_numpy(logits), n_used, gating, norm, scale,
                           None if selection_bias is None else self.to_numpy(selection_bias), groups)
        host = {n: None if b is None else self.to_numpy(b) for n, b in
                (("gate", gate_bias), ("up", up_bias), ("down", down_bias))}
        if expert_scale is not None:
            w = w * self.to_numpy(expert_scale)[top]
        out = self.zeros((x.shape[0], D))

        def rows(wt, start, n):
            return self.weight_rows(wt, start, n)

        for n in range(x.shape[0]):
            xn, on = x[n:n + 1], out[n:n + 1]
            for k in range(top.shape[1]):
                e = int(top[n, k])
                g, u = (rows(w_gate, 2 * e * F, F), rows(w_gate, (2 * e + 1) * F, F)) if w_up is None else \
                    (rows(w_gate, e * F, F), rows(w_up, e * F, F))
                xe = self.scale(xn, float(w[n, k])) if weight_before else xn
                if act == "swiglu_oai":
                    gv, uv = (self.to_numpy(t) for t in self.matmul_n(xe, [g, u]))
                    if host["gate"] is not None:
                        gv, uv = gv + host["gate"][e], uv + host["up"][e]
                    y = self.matmul(self.asarray(swiglu_oai(gv, uv)), rows(w_down, e * D, D))
                else:
                    y = self.matmul(self.matmul_glu(xe, g, u, act=act), rows(w_down, e * D, D))
                if host["down"] is not None:
                    y = self.add(y, self.asarray(host["down"][e]))
                self.add(on, y if weight_before else self.scale(y, float(w[n, k])), out=on)
        return out

    def embed(self, w, ids, scale=1.0):
        """Rows ids of an embedding matrix [n_vocab, dim], dequantized: [len(ids), dim]."""
        ids = self.positions(ids)
        n = ids.size
        M, K = w.shape
        out = self.empty((n, K))
        self.k(f"get_rows_{MM_KERNEL[w.ggml_type]}")(
            ((K // 8 + 127) // 128, n, 1), (128, 1, 1), W=w.ptr, ids=ids.ptr, out=out.ptr, K=K, rb=w.row_bytes,
            scale=float(scale))
        return out

    # -- element-wise ------------------------------------------------------------
    def _binary(self, name, a, b, out):
        if a.shape != b.shape:
            raise ValueError(f"{name}: shapes {a.shape} and {b.shape}")
        out = out if out is not None else self.empty(a.shape)
        self.k(name)(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, b=b.ptr, y=out.ptr, n=a.size)
        return out

    def add(self, a, b, out=None):
        if b.ndim == 1 and a.shape[-1] == b.shape[0] and a.shape != b.shape:
            out = out if out is not None else self.empty(a.shape)
            self.k("add_row_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, v=b.ptr, y=out.ptr, n=a.size,
                                  ncol=b.size)
            return out
        return self._binary("add_f32", a, b, out)

    def mul(self, a, b, out=None):
        if b.ndim == 1 and a.shape[-1] == b.shape[0] and a.shape != b.shape:
            out = out if out is not None else self.empty(a.shape)
            self.k("mul_row_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, v=b.ptr, y=out.ptr, n=a.size,
                                  ncol=b.size)
            return out
        if a.ndim == 2 and b.shape == (a.shape[0], 1) and a.shape != b.shape:  # a per-row gate
            out = out if out is not None else self.empty(a.shape)
            if a.size:
                self.k("mul_col_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, v=b.ptr, y=out.ptr, n=a.size,
                                      ncol=a.shape[1])
            return out
        return self._binary("mul_f32", a, b, out)

    def scale(self, a, s, out=None):
        out = out if out is not None else self.empty(a.shape)
        self.k("scale_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, s=float(s), y=out.ptr, n=a.size)
        return out

    def softcap(self, a, cap, out=None):
        out = out if out is not None else self.empty(a.shape)
        self.k("softcap_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, c=float(cap), y=out.ptr, n=a.size)
        return out

    def _unary(self, kernel, a):
        """A new array of `kernel` (an elementwise y[i] = f(a[i]) of elementwise.cuh or
        recurrent.cuh) applied to a."""
        out = self.empty(a.shape)
        self.k(kernel)(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, y=out.ptr, n=a.size)
        return out

    def silu(self, a):
        return self._unary("silu_f32", a)

    def gelu(self, a):
        return self._unary("gelu_f32", a)

    def _glu(self, name, g, u):
        if g.shape != u.shape:
            raise ValueError(f"{name}: shapes {g.shape} and {u.shape}")
        ncol = g.shape[-1]
        out = self.empty(g.shape)
        self.k(name)(_ew_grid(g.size), (EW_BLOCK, 1, 1), g=g.ptr, u=u.ptr, y=out.ptr, n=g.size, ncol=ncol, gs=ncol,
                     us=ncol)
        return out

    def swiglu(self, g, u):
        """silu(g) * u"""
        return self._glu("swiglu_f32", g, u)

    def geglu(self, g, u):
        """gelu_tanh(g) * u"""
        return self._glu("geglu_f32", g, u)

    # -- normalization, rotary ---------------------------------------------------------
    def rms_norm(self, x, w, eps):
        dim = x.shape[-1]
        out = self.empty(x.shape)
        rows = x.size // dim
        threads = 1024 if dim >= 4096 else (256 if dim >= 512 else 64)
        self.k("rmsnorm_f32")((rows, 1, 1), (threads, 1, 1), x=x.ptr, w=w.ptr if w is not None else 0, y=out.ptr,
                              dim=dim, eps=float(eps))
        return out

    def positions(self, pos):
        """int32 device array of positions (a list / range / numpy array)."""
        if isinstance(pos, DeviceArray):
            return pos
        return self.asarray(np.asarray(pos, dtype=np.int32))

    def rope(self, x, pos, *, n_rot=None, base=10000.0, freq_scale=1.0, freq_factors=None,
             neox=False, mscale=1.0, inplace=False, yarn=None):
        """Rotate x [N, H, hd] (in place when inplace, else a copy) at positions pos [N]."""
        N, H, hd = x.shape
        n_rot = hd if n_rot is None else n_rot
        if n_rot % 2 or not 0 <= n_rot <= hd:
            raise ValueError(f"rope: n_rot {n_rot} for head dim {hd}")
        pos = self.positions(pos)
        if not inplace:
            y = self.empty(x.shape)
            self.k("copy_f32")(_ew_grid(x.size), (EW_BLOCK, 1, 1), a=x.ptr, y=y.ptr, n=x.size)
            x = y
        total = N * H * (n_rot // 2)
        if yarn is not None and yarn[0] != 0.0:
            ext_factor, lo, hi, ms = yarn_args(yarn, n_rot, base, freq_scale, mscale)
            self.k("rope_yarn_f32")(_ew_grid(total), (EW_BLOCK, 1, 1), x=x.ptr, pos=pos.ptr, N=N, H=H, hd=hd,
                                    n_rot=n_rot, base=float(base), freq_scale=float(freq_scale),
                                    ff=freq_factors.ptr if freq_factors is not None else 0, neox=1 if neox else 0,
                                    mscale=float(ms), ext_factor=float(ext_factor), lo=float(lo), hi=float(hi))
            return x
        self.k("rope_f32")(_ew_grid(total), (EW_BLOCK, 1, 1), x=x.ptr, pos=pos.ptr, N=N, H=H, hd=hd, n_rot=n_rot,
                           base=float(base), freq_scale=float(freq_scale),
                           ff=freq_factors.ptr if freq_factors is not None else 0, neox=1 if neox else 0,
                           mscale=float(mscale))
        return x

    def rms_norm_rope(self, x, w, eps, pos, *, n_rot=None, base=10000.0, freq_scale=1.0,
                      freq_factors=None, neox=False, mscale=1.0):
        """rms_norm of each head row of x [N, H, hd] then rope, in place: one launch."""
        N, H, hd = x.shape
        n_rot = hd if n_rot is None else n_rot
        if n_rot % 2 or not 0 < n_rot <= hd:
            raise ValueError(f"rms_norm_rope: n_rot {n_rot} for head dim {hd}")
        pos = self.positions(pos)
        rows = N * H
        if rows == 0:
            return x
        self.k("rmsnorm_rope_f32")(((rows + NORM_ROPE_ROWS - 1) // NORM_ROPE_ROWS, 1, 1),
                                   (32 * NORM_ROPE_ROWS, 1, 1), x=x.ptr, w=w.ptr if w is not None else 0,
                                   pos=pos.ptr, rows=rows, H=H, hd=hd, eps=float(eps), n_rot=n_rot, base=float(base),
                                   freq_scale=float(freq_scale),
                                   ff=freq_factors.ptr if freq_factors is not None else 0, neox=1 if neox else 0,
                                   mscale=float(mscale))
        return x

    # -- attention ---------------------------------------------------------------
    def _att_tickets(self):
        """attention_split_last_f16kv's counters, one per (query, head) of a split launch (fewer
        than ATT_SPLIT_BELOW): zero between launches (each launch's last blocks reset theirs).
        Made and zeroed outside any capture (capture() makes them first), kept for good."""
        t = self._att_count
        if t is None:
            if self._graph is not None:
                raise RuntimeError("attention tickets first needed inside a capture")
            t = DeviceArray.empty(self.pool, (ATT_SPLIT_BELOW,), "int32")
            self.rt.drv.memset_d8_async(t.ptr, 0, t.nbytes, self.rt.stream)
            self._att_count = t
        return t

    def kv_store(self, k_cache, v_cache, k, v, slots):
        """Write k, v [N, Hkv, hd] into a layer's K/V [Hkv, n_slots, hd] at the given slots (v and
        v_cache None: keys only, an MLA latent)."""
        N, Hkv, hd = k.shape
        if (v is None) != (v_cache is None):
            raise ValueError("kv_store: v and v_cache must both be given or both be None")
        if k_cache.shape[0] != Hkv or k_cache.shape[2] != hd or (v is not None and v.size != k.size):
            raise ValueError(f"kv_store: k {k.shape} into {k_cache.shape}")
        slots = self.positions(slots)
        if k_cache.dtype == "float32":  # an exact (MLA latent) cache: keys only
            if v is not None or Hkv != 1:
                raise ValueError("kv_store: a float32 cache holds one latent head, keys only")
            self.k("kv_store_latent_f32")(_ew_grid(k.size), (EW_BLOCK, 1, 1), k=k.ptr, kc=k_cache.ptr,
                                          pos=slots.ptr, N=N, dk=hd)
            return
        self.k("kv_store")(_ew_grid(k.size), (EW_BLOCK, 1, 1), k=k.ptr, v=v.ptr if v is not None else 0,
                           kc=k_cache.ptr, vc=v_cache.ptr if v_cache is not None else 0, pos=slots.ptr, N=N, Hkv=Hkv,
                           hd=hd, ctx=k_cache.shape[1])

    def attention(self, q, k_cache, v_cache, pos, n_kv, *, scale, softcap=0.0, causal=True, window=0,
                  mask=None, v_dim=None, sinks=None, chunk=0):
        """q [N, Hq, hd] over keys 0..n_kv-1 of a layer's K/V [Hkv, n_slots, hd] -> [N, Hq, hd];
        attention sinks [Hq] and chunked attention (span: chunk) in every form's kernels."""
        if v_cache is None:
            if sinks is not None or chunk:
                raise ValueError("attention: sinks and chunks need a v_cache")
            return self._latent_attention(q, k_cache, pos, n_kv, scale, softcap, causal, window, mask, v_dim)
        N, Hq, hd = q.shape
        span = int(chunk)
        if sinks is not None and (sinks.shape != (Hq,) or sinks.dtype != "float32"):
            raise ValueError(f"attention: sinks {sinks.dtype} {sinks.shape} for {Hq} heads")
        sptr = sinks.ptr if sinks is not None else 0
        if hd > ATT_MAX_HD:
            raise ReflexError("unsupported_architecture", f"head_dim {hd} > {ATT_MAX_HD}")
        pos = self.positions(pos)
        out = self.empty(q.shape)
        Hkv, ctx = k_cache.shape[0], k_cache.shape[1]
        keys = int(n_kv)  # the keys in use now (the caller's n_kv) before the position-free n_slots
        if causal and mask is None:
            # keys 0..pos[n] are the visible ones whatever n_kv is (pos[n] < n_kv): passing
            # n_slots keeps the launch arguments position-free, so a captured graph replays
            n_kv = ctx
        n_kv = int(n_kv)
        mptr = mask.ptr if mask is not None else 0
        if N * Hq < ATT_SPLIT_BELOW and n_kv > ATT_CHUNK:
            # few (head, query) blocks for a long key range (decode): split the keys over
            # blocks, then merge the partial softmaxes
            chunk = max(ATT_CHUNK, -(-n_kv // ATT_MAX_SPLITS))
            S = -(-n_kv // chunk)
            ml = self.empty((N * Hq * S * 2,))
            acc = self.empty((N * Hq * S * hd,))
            if fusion_on():  # one launch: the last block of each (head, query) merges
                kern = self.k("attention_split_last_f16kv")
                kern((Hq, N, S), (32 * ATT_WARPS, 1, 1),
                     kern.head(q=q.ptr, kc=k_cache.ptr, vc=v_cache.ptr, part_ml=ml.ptr, part_acc=acc.ptr, out=out.ptr,
                               count=self._att_tickets().ptr, pos=pos.ptr, mask=mptr, sinks=sptr),
                     Hq=Hq, Hkv=Hkv, hd=hd, ctx=ctx, n_kv=n_kv, scale=float(scale), softcap=float(softcap),
                     causal=1 if causal else 0, window=int(window), chunk=chunk, span=span)
                return out
            kern = self.k("attention_split_f16kv")
            kern((Hq, N, S), (32 * ATT_WARPS, 1, 1),
                 kern.head(q=q.ptr, kc=k_cache.ptr, vc=v_cache.ptr, part_ml=ml.ptr, part_acc=acc.ptr, pos=pos.ptr,
                           mask=mptr),
                 Hq=Hq, Hkv=Hkv, hd=hd, ctx=ctx, n_kv=n_kv, scale=float(scale), softcap=float(softcap),
                 causal=1 if causal else 0, window=int(window), chunk=chunk, span=span)
            self.k("attention_combine")((Hq, N, 1), (max(32, (hd + 31) // 32 * 32), 1, 1), part_ml=ml.ptr,
                                        part_acc=acc.ptr, out=out.ptr, sinks=sptr, Hq=Hq, hd=hd, S=S)
            return out
        if (self.flash_takes(N, Hq, Hkv, hd) and v_cache.shape == k_cache.shape
                and k_cache.ptr % 16 == 0 and v_cache.ptr % 16 == 0 and q.ptr % 8 == 0):
            # (cp.async moves 16-byte chunks of K/V rows; q is read as float2)
            # rows n * G + (h % G) of each kv head (G = Hq / Hkv), FLASH_BM per block
            tiles = Hkv * -(-N * (Hq // Hkv) // FLASH_BM)  # blocks along x and y
            # keys to cover: while capturing a graph every slot (replays see later positions)
            cover = n_kv if self._graph is not None else min(n_kv, max(1, keys))  # (span: the chunk)
            chunk, S = self._flash_split(tiles, cover)
            self.flash_launches += 1
            self.flash_last_splits = S
            ml = acc = None
            if S > 1:
                ml = self.empty((N * Hq * S * 2,))
                acc = self.empty((N * Hq * S * hd,))
            kern = self.k(f"flash_attention_f16kv_{hd}")
            kern((Hkv, tiles // Hkv, S), (FLASH_THREADS, 1, 1),
                 kern.head(q=q.ptr, kc=k_cache.ptr, vc=v_cache.ptr, out=out.ptr, part_ml=ml.ptr if ml is not None else 0,
                           part_acc=acc.ptr if acc is not None else 0, pos=pos.ptr, mask=mptr, sinks=sptr),
                 N=N, Hq=Hq, Hkv=Hkv, ctx=ctx, n_kv=n_kv, scale=float(scale), softcap=float(softcap),
                 causal=1 if causal else 0, window=int(window), chunk=chunk, span=span)
            if S > 1:
                self.k("attention_combine")((Hq, N, 1), (max(32, (hd + 31) // 32 * 32), 1, 1), part_ml=ml.ptr,
                                            part_acc=acc.ptr, out=out.ptr, sinks=sptr, Hq=Hq, hd=hd, S=S)
            return out
        kern = self.k("attention_f16kv")
        kern((Hq, N, 1), (32 * ATT_WARPS, 1, 1),
             kern.head(q=q.ptr, kc=k_cache.ptr, vc=v_cache.ptr, out=out.ptr, pos=pos.ptr, mask=mptr, sinks=sptr),
             Hq=Hq, Hkv=Hkv, hd=hd, ctx=ctx, n_kv=n_kv, scale=float(scale), softcap=float(softcap),
             causal=1 if causal else 0, window=int(window), span=span)
        return out

    def pos_scale(self, x, pos, *, floor, scale, offset=1.0):
        """base.py's pos_scale: archops.cuh's pos_scale_f32 (positions read on the device, so a
        captured decode step replays it)."""
        pos = self.positions(pos)
        out = self.empty(x.shape)
        n = x.size
        if n:
            self.k("pos_scale_f32")(_ew_grid(n), (EW_BLOCK, 1, 1), x=x.ptr, pos=pos.ptr, y=out.ptr, n=n,
                                    row=n // x.shape[0], floor_=float(floor), scale=float(scale), offset=float(offset))
        return out

    def flash_takes(self, N, Hq, Hkv, hd):
        """True when attention of N queries (not the split-key decode form) runs on the
        tensor-core kernel (flash.cuh): sm_80+, REFLEX_FLASH not 0, N >= FLASH_MIN_N, a head
        width it is built for, whole kv groups."""
        return self.flash and N >= self.flash_min_n and hd in FLASH_HD and Hq % Hkv == 0

    def _flash_split(self, tiles, span):
        """(chunk, S) of flash_attention_f16kv_*: S = 1 (chunk unused) when its `tiles` row-tile
        blocks fill the GPU or the keys are few, else S shares of `chunk` keys (a multiple of 64)
        covering keys 0..span-1 (FLASH_SPLIT_* above)."""
        sms = self._sm_count()
        if tiles >= FLASH_SPLIT_BELOW * sms or span <= 2 * FLASH_CHUNK:
            return span, 1
        S = min(FLASH_MAX_SPLITS, -(-FLASH_SPLIT_TARGET * sms // tiles), -(-span // FLASH_CHUNK))
        per = -(-span // S)
        chunk = -(-per // 64) * 64
        return chunk, -(-span // chunk)

    def _latent_attention(self, q, k_cache, pos, n_kv, scale, softcap, causal, window, mask, v_dim):
        """attention with v_cache None: q [N, H, dk] over the one latent head k_cache [1, ctx, dk];
        the values are the first v_dim dims of the keys -> [N, H, v_dim]. mla_attention_split
        over (head, query, key block), then attention_combine (position-free arguments when
        causal without a mask, as attention's: a captured graph replays it)."""
        N, H, dk = q.shape
        if k_cache.shape[0] != 1 or k_cache.shape[2] != dk:
            raise ValueError(f"latent attention: q {q.shape} over a cache {k_cache.shape} (one head of {dk})")
        if dk > MLA_MAX_D:
            raise ReflexError("unsupported_architecture", f"latent attention: key width {dk} > {MLA_MAX_D}")
        dv = int(v_dim)
        if not 0 < dv <= dk:
            raise ValueError(f"latent attention: v_dim {v_dim} of {dk}")
        pos = self.positions(pos)
        ctx = k_cache.shape[1]
        if causal and mask is None:
            n_kv = ctx
        n_kv = int(n_kv)
        out = self.empty((N, H, dv))
        chunk, S = mla_split_plan(N * H, n_kv)
        ml = self.empty((N * H * S * 2,))
        acc = self.empty((N * H * S * dv,))
        kern = self.k("mla_attention_split_f32" if k_cache.dtype == "float32" else "mla_attention_split")
        kern((H, N, S), (32 * MLA_WARPS, 1, 1),
             kern.head(q=q.ptr, kc=k_cache.ptr, part_ml=ml.ptr, part_acc=acc.ptr, pos=pos.ptr,
                       mask=mask.ptr if mask is not None else 0),
             H=H, dk=dk, dv=dv, n_kv=n_kv, scale=float(scale), softcap=float(softcap), causal=1 if causal else 0,
             window=int(window), chunk=chunk)
        self.k("attention_combine")((H, N, 1), (min(1024, max(32, (dv + 31) // 32 * 32)), 1, 1), part_ml=ml.ptr,
                                    part_acc=acc.ptr, out=out.ptr, sinks=0, Hq=H, hd=dv, S=S)
        return out

    # -- multi-head latent attention --------------------------------------------------
    def mla_attention(self, q_nope, q_pe, kv, wk_b, wv_b, slots, n_kv, *, scale, causal=True, window=0,
                      mask=None):
        """base.latent_attention. Long prompts (mla_flash_takes): the latents c of keys
        0..n_kv-1 as f16 [n_kv, R] (copy_cols_f16, or copy_cols_f32_f16 from the exact float32
        latent), each head's keys k_nope = W_h^T c by a GEMM
        on attn_k_b's transpose (mla_kb_t_*, made once per layer and kept) and values by one on
        attn_v_b, packed with the shared rope key into f16 K [H, n_kv, nope + r] and V [H, n_kv, dv]
        (mla_pack_kv_f32), then flash attention of q = [q_nope, q_pe] (flash.cuh). Else the
        absorbed form (decode)."""
        N, H, nope = q_nope.shape
        r = q_pe.shape[2]
        R = kv.shape[2] - r
        dv = wv_b.shape[0] // H if isinstance(wv_b, DeviceWeight) else 0
        n_kv = int(n_kv)
        if not self.mla_flash_takes(N, H, nope, r, R, dv, n_kv, wk_b, wv_b):
            from .base import latent_attention_absorbed

            return latent_attention_absorbed(self, q_nope, q_pe, kv, wk_b, wv_b, slots, n_kv, scale=scale,
                                             causal=causal, window=window, mask=mask)
        kbt = self._mla_kb_t(wk_b, H, R, nope)
        xc = self.empty((n_kv, R), "float16")
        kc32 = kv.dtype == "float32"  # the exact latent (SlotSpec(exact=True)), else f16
        self.k("copy_cols_f32_f16" if kc32 else "copy_cols_f16")(_ew_grid(n_kv * R), (EW_BLOCK, 1, 1), x=kv.ptr,
                                                                  y=xc.ptr, rows=n_kv, n=R, xs=R + r, xo=0, ys=R,
                                                                  yo=0)
        kn, v = self.empty((n_kv, H * nope)), self.empty((n_kv, H * dv))
        self._mma((kbt,), xc, kn, R, H * nope, n_kv, 0)
        self._mma((wv_b,), xc, v, R, H * dv, n_kv, 0)
        K, V = self.empty((H, n_kv, nope + r), "float16"), self.empty((H, n_kv, dv), "float16")
        self.k("mla_pack_kv_f32")(_ew_grid(H * n_kv * (nope + r + dv)), (EW_BLOCK, 1, 1), kn=kn.ptr, v=v.ptr,
                                  kc=kv.ptr, K=K.ptr, V=V.ptr, n=n_kv, H=H, nope=nope, r=r, R=R, dv=dv,
                                  kc32=1 if kc32 else 0)
        q = self.concat([q_nope, q_pe])
        pos = self.positions(slots)
        out = self.empty((N, H, dv))
        tiles = H * -(-N // FLASH_BM)
        chunk, S = self._flash_split(tiles, n_kv)
        ml = acc = None
        if S > 1:
            ml, acc = self.empty((N * H * S * 2,)), self.empty((N * H * S * dv,))
        kern = self.k(f"flash_attention_f16kv_{MLA_FLASH_KV[(nope + r, dv)]}")
        kern((H, tiles // H, S), (FLASH_THREADS, 1, 1),
             kern.head(q=q.ptr, kc=K.ptr, vc=V.ptr, out=out.ptr, part_ml=ml.ptr if ml is not None else 0,
                       part_acc=acc.ptr if acc is not None else 0, pos=pos.ptr,
                       mask=mask.ptr if mask is not None else 0, sinks=0),
             N=N, Hq=H, Hkv=H, ctx=n_kv, n_kv=n_kv, scale=float(scale), softcap=0.0, causal=1 if causal else 0,
             window=int(window), chunk=chunk, span=0)
        if S > 1:
            self.k("attention_combine")((H, N, 1), (max(32, (dv + 31) // 32 * 32), 1, 1), part_ml=ml.ptr,
                                        part_acc=acc.ptr, out=out.ptr, sinks=0, Hq=H, hd=dv, S=S)
        self.mla_flash_launches += 1
        return out

    def mla_flash_takes(self, N, H, nope, r, R, dv, n_kv, wk_b, wv_b):
        """Whether mla_attention decompresses: sm_80+, REFLEX_MLA_FLASH not 0, N >= mla_flash_min_n,
        not while capturing (the transposed attn_k_b is made on first use), a flash kernel for
        (nope + r, dv), at most MLA_FLASH_MAX_KEYS keys, weights on the device with attn_v_b in a
        tensor-core format and R a multiple of 8."""
        return (self.mla_flash and N >= self.mla_flash_min_n and self._graph is None
                and (nope + r, dv) in MLA_FLASH_KV and 0 < n_kv <= MLA_FLASH_MAX_KEYS and R % 8 == 0
                and isinstance(wk_b, DeviceWeight) and wk_b.shape == (H * R, nope) and nope % 8 == 0
                and isinstance(wv_b, DeviceWeight) and wv_b.shape == (H * dv, R) and wv_b.ggml_type in MMA_FORMATS)

    def _mla_kb_t(self, wk_b, H, R, nope):
        """attn_k_b [H*R, nope] transposed per head to an f16 weight [H*nope, R] (mla_kb_t_*),
        made on first use and kept for the backend's life (H*nope*R*2 bytes a layer)."""
        w = self._mla_kbt.get(wk_b.ptr)
        if w is None:
            t = self.empty((H * nope, R), "float16")
            self.k(f"mla_kb_t_{MM_KERNEL[wk_b.ggml_type]}")(_ew_grid(H * R * (nope // 8)), (EW_BLOCK, 1, 1),
                                                             W=wk_b.ptr, y=t.ptr, H=H, R=R, nope=nope,
                                                             rb=wk_b.row_bytes)
            w = DeviceWeight(t.ptr, (H * nope, R), F16, "F16", R * 2, f"{wk_b.name} transposed", t)
            self._mla_kbt[wk_b.ptr] = w
        return w

    def _copy_cols(self, x, xo, y, yo, n):
        """y[..., yo:yo+n] = x[..., xo:xo+n] over the rows of 2+-D contiguous x and y."""
        rows = x.size // x.shape[-1]
        if rows and n:
            self.k("copy_cols_f32")(_ew_grid(rows * n), (EW_BLOCK, 1, 1), x=x.ptr, y=y.ptr, rows=rows, n=n,
                                    xs=x.shape[-1], xo=xo, ys=y.shape[-1], yo=yo)

    def split(self, x, sizes):
        """x [..., sum(sizes)] -> its column slices as new contiguous arrays (one launch each)."""
        sizes = [int(n) for n in sizes]
        if sum(sizes) != x.shape[-1] or any(n < 0 for n in sizes):
            raise ValueError(f"split: sizes {sizes} of {x.shape[-1]} columns")
        out, a = [], 0
        for n in sizes:
            y = self.empty(x.shape[:-1] + (n,))
            self._copy_cols(x, a, y, 0, n)
            out.append(y)
            a += n
        return out

    def concat(self, xs):
        """Arrays [..., d_i] of one leading shape -> [..., sum(d_i)] (one launch each)."""
        lead = tuple(xs[0].shape[:-1])
        if any(tuple(x.shape[:-1]) != lead for x in xs):
            raise ValueError(f"concat: leading shapes {[tuple(x.shape) for x in xs]}")
        out = self.empty(lead + (sum(x.shape[-1] for x in xs),))
        a = 0
        for x in xs:
            self._copy_cols(x, 0, out, a, x.shape[-1])
            a += x.shape[-1]
        return out

    def head_matmul(self, x, w):
        """x [N, H, K] and a weight [H*M, K] (a 3-D [H, M, K] tensor) -> [N, H, M], y[n, h] =
        w[h] @ x[n, h]: one launch of hmm (mla.cuh), reading each head's rows in place."""
        if not isinstance(w, DeviceWeight):
            raise TypeError("head_matmul needs a DeviceWeight from load_weight")
        N, H, K = x.shape
        if w.shape[1] != K or w.shape[0] % H:
            raise ValueError(f"head_matmul: x {x.shape} with weight {w.shape}")
        if K % 8:
            raise ReflexError("unsupported_architecture", f"{w.name}: rows of {K} (need a multiple of 8)")
        M = w.shape[0] // H
        out = self.empty((N, H, M))
        if N == 0:
            return out
        nt = 1 if N == 1 else 8
        self.k(f"hmm{nt}_{MM_KERNEL[w.ggml_type]}")(((H * M + MM_ROWS - 1) // MM_ROWS, (N + nt - 1) // nt, 1),
                                                    (32 * MM_ROWS, 1, 1), W=w.ptr, X=x.ptr, Y=out.ptr, K=K, M=M,
                                                    H=H, N=N, rb=w.row_bytes)
        return out

    # -- recurrent layers ----------------------------------------------------------------
    def sigmoid(self, a):
        return self._unary("sigmoid_f32", a)

    def softplus(self, a):
        return self._unary("softplus_f32", a)

    def columns(self, x, start, n):
        W = x.shape[-1]
        if not (0 <= start and 0 <= n and start + n <= W):
            raise ValueError(f"columns: {start}..{start + n} of {W}")
        out = self.empty(x.shape[:-1] + (n,))
        if out.size:
            self.k("columns_f32")(_ew_grid(out.size), (EW_BLOCK, 1, 1), x=x.ptr, y=out.ptr, total=out.size, W=W,
                                  start=int(start), ncol=int(n))
        return out

    def _seq_arg(self, seqs, N, n_seq):
        """(device pointer, n_groups, most tokens in a group) of the kernels' sequence groups
        (recurrent.cuh's `sg`) for per-token sequences seqs (a host int array [N]; None: pointer
        0, every token in sequence 0, so a decode step has nothing to write before a graph
        replay). Memoized for the last seqs array: every layer of a batch passes the same one."""
        if seqs is None:
            return 0, 1, N
        memo = self._seq_memo
        if memo is not None and memo[0] is seqs:
            return memo[1]
        arr = np.asarray(seqs).reshape(-1)
        if arr.size != N:
            raise ValueError(f"seqs: {arr.size} sequence ids for {N} tokens")
        if N and (int(arr.min()) < 0 or int(arr.max()) >= n_seq):
            raise ValueError(f"seqs: sequence ids {int(arr.min())}..{int(arr.max())} for a state of {n_seq}")
        host, n_groups = seq_group_table(arr, N)
        dev = self.asarray(host, "int32")
        arg = (dev.ptr, n_groups, int(np.diff(host[:n_groups + 1]).max()))
        self._seq_memo = (seqs, arg, dev)  # dev: keeps the buffer alive while arg points at it
        return arg

    @staticmethod
    def _f32(name, *arrays):
        for a in arrays:
            if getattr(a, "dtype", None) != "float32" or not isinstance(a, DeviceArray):
                raise TypeError(f"{name}: expected float32 device arrays, got {a!r}")

    def ssm_conv(self, x, state, w, seqs=None):
        """Causal depthwise conv of x [N, C] with each sequence's last K-1 inputs (state
        [n_seq, K-1, C], updated); w float32 [C, K]."""
        return self._ssm_conv(x, state, w, seqs, 0)

    def ssm_conv_silu(self, x, state, w, seqs=None):
        """silu(ssm_conv(x, state, w, seqs)) (base.ssm_conv_silu): the silu in the conv kernel."""
        return self._ssm_conv(x, state, w, seqs, 1)

    def _ssm_conv(self, x, state, w, seqs, act):
        self._f32("ssm_conv", x, state, w)
        N, C = x.shape
        K = w.shape[1]
        if w.shape != (C, K) or tuple(state.shape[1:]) != (K - 1, C) or K < 2:
            raise ValueError(f"ssm_conv: x {x.shape}, state {state.shape}, w {w.shape}")
        out = self.empty((N, C))
        sg, G, T = self._seq_arg(seqs, N, state.shape[0])
        if N:
            cb = (C + EW_BLOCK - 1) // EW_BLOCK
            z = min(T, CONV_TOKEN_BLOCKS)  # 1 for a decode step: the state is updated in the same kernel
            self.k("ssm_conv_f32")((cb, G, z), (EW_BLOCK, 1, 1), x=x.ptr, state=state.ptr, w=w.ptr, y=out.ptr, sg=sg,
                                  n_groups=G, N=N, C=C, K=K, act=act)
            if z > 1:
                self.k("ssm_conv_state_f32")((cb, G, 1), (EW_BLOCK, 1, 1), x=x.ptr, state=state.ptr, sg=sg, n_groups=G,
                                        N=N, C=C, K=K)
        return out

    # -- fused element-wise ops of the hybrid layers (kernels/hybrid.cuh; models reach them
    # through base.py's functions of the same names, whose plain ops define them) ------------
    def delta_gates(self, alpha, dt_bias, a, b):
        """(softplus(alpha + dt_bias) * a, sigmoid(b)): alpha, b [N, H]; dt_bias, a [H]."""
        self._f32("delta_gates", alpha, dt_bias, a, b)
        H = alpha.shape[-1]
        if b.shape != alpha.shape or dt_bias.shape != (H,) or a.shape != (H,):
            raise ValueError(f"delta_gates: alpha {alpha.shape} dt_bias {dt_bias.shape} a {a.shape} b {b.shape}")
        g, beta = self.empty(alpha.shape), self.empty(alpha.shape)
        if alpha.size:
            self.k("delta_gates_f32")(_ew_grid(alpha.size), (EW_BLOCK, 1, 1), alpha=alpha.ptr, bias=dt_bias.ptr,
                                      a=a.ptr, b=b.ptr, g=g.ptr, beta=beta.ptr, n=alpha.size, H=H)
        return g, beta

    def delta_qkv(self, c, n_k, n_v, d, eps):
        """c [N, (2 n_k + n_v) d] -> q, k [N, n_k, d] L2-normalized, v [N, n_v, d] (base.delta_qkv)."""
        self._f32("delta_qkv", c)
        N = c.shape[0]
        rpt = 2 * n_k + n_v  # head rows per token
        if c.ndim != 2 or c.shape[1] != rpt * d:
            raise ValueError(f"delta_qkv: c {c.shape} for {n_k} + {n_k} + {n_v} heads of {d}")
        q, k, v = self.empty((N, n_k, d)), self.empty((N, n_k, d)), self.empty((N, n_v, d))
        rows = N * rpt
        if rows:
            self.k("delta_qkv_f32")((-(-rows // HYB_ROWS), 1, 1), (32 * HYB_ROWS, 1, 1), c=c.ptr, q=q.ptr, k=k.ptr,
                                    v=v.ptr, N=N, nk=n_k, nv=n_v, d=d, eps=float(eps / d),
                                    scale=float(1.0 / math.sqrt(d)))
        return q, k, v

    def rms_norm_gate(self, x, w, eps, z):
        """rms_norm(x, w, eps) * silu(z) over x's last axis; z of x's shape (base.rms_norm_gate)."""
        self._f32("rms_norm_gate", x, z, *([w] if w is not None else []))
        d = x.shape[-1]
        if z.shape != x.shape or (w is not None and w.shape != (d,)):
            raise ValueError(f"rms_norm_gate: x {x.shape} w {None if w is None else w.shape} z {z.shape}")
        out = self.empty(x.shape)
        rows = x.size // d if d else 0
        if rows:
            self.k("rms_norm_gate_f32")((-(-rows // HYB_ROWS), 1, 1), (32 * HYB_ROWS, 1, 1), x=x.ptr,
                                        w=w.ptr if w is not None else 0, z=z.ptr, y=out.ptr, rows=rows, d=d,
                                        eps=float(eps))
        return out

    def sigmoid_gate(self, a, x, start, width):
        """a * sigmoid(columns(x, start, width)) (base.sigmoid_gate): x's rows of W columns,
        a [..] with rows * width elements."""
        self._f32("sigmoid_gate", a, x)
        W = x.shape[-1]
        rows = x.size // W if W else 0
        if not (0 <= start and 0 < width and start + width <= W) or a.size != rows * width:
            raise ValueError(f"sigmoid_gate: a {a.shape}, columns {start}..{start + width} of x {x.shape}")
        out = self.empty(a.shape)
        if a.size:
            self.k("sigmoid_gate_f32")(_ew_grid(a.size), (EW_BLOCK, 1, 1), a=a.ptr, x=x.ptr, y=out.ptr, n=a.size,
                                       width=width, W=W, start=int(start))
        return out

    def _chunked_path(self, T):
        """True when a call whose longest sequence group has T tokens runs the chunked kernels
        (counted in recur_calls either way)."""
        use = self.chunked and T >= self.chunk_min
        if use:
            self.n_chunked_calls += 1
        else:
            self.n_sequential_calls += 1
        return use

    @property
    def recur_calls(self):
        return {"chunked": self.n_chunked_calls, "sequential": self.n_sequential_calls}

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        """The gated delta rule (base.py): the chunked kernels when a sequence group has
        chunk_min tokens or more (see CHUNK_MIN), else sequential in time with each state row
        in a warp's registers (decode)."""
        self._f32("delta_net", q, k, v, g, beta, state)
        N, Hk, D = q.shape
        Hv = v.shape[1]
        if (k.shape != q.shape or v.shape != (N, Hv, D) or g.size != N * Hv or beta.size != N * Hv
                or tuple(state.shape[1:]) != (Hv, D, D) or Hv % Hk):
            raise ValueError(f"delta_net: q {q.shape} k {k.shape} v {v.shape} g {g.shape} beta {beta.shape} "
                             f"state {state.shape}")
        if D > RECUR_MAX_COLS:
            raise ReflexError("unsupported_architecture", f"delta_net: state size {D} > {RECUR_MAX_COLS}")
        out = self.empty((N, Hv, D))
        sg, G, T = self._seq_arg(seqs, N, state.shape[0])
        if not N:
            return out
        if self._chunked_path(T):
            # workspaces, by a token's position in the group table's order (chunked.cuh)
            aqk, gc = self.empty((N, Hv, CHUNK_L)), self.empty((N, Hv))
            wv, wk = self.empty((N, Hv, D)), self.empty((N, Hv, D))
            kern = self.k("delta_chunk_prep_f32")
            kern((-(-T // CHUNK_L), Hv, G), (CHUNK_THREADS, 1, 1),
                 kern.head(q=q.ptr, k=k.ptr, v=v.ptr, g=g.ptr, beta=beta.ptr, Aqk=aqk.ptr, Gc=gc.ptr, Wv=wv.ptr,
                           Wk=wk.ptr, sg=sg),
                 n_groups=G, N=N, Hk=Hk, Hv=Hv, D=D)
            kern = self.k("delta_chunk_scan_f32")
            kern((-(-D // CHUNK_ROWS), Hv, G), (CHUNK_THREADS, 1, 1),
                 kern.head(q=q.ptr, k=k.ptr, Wv=wv.ptr, Wk=wk.ptr, Aqk=aqk.ptr, Gc=gc.ptr, state=state.ptr,
                           out=out.ptr, sg=sg),
                 n_groups=G, N=N, Hk=Hk, Hv=Hv, D=D, scale=float(scale))
            return out
        rows = Hv * D
        self.k("delta_net_f32")(((rows + RECUR_WARPS - 1) // RECUR_WARPS, G, 1), (32 * RECUR_WARPS, 1, 1),
                                q=q.ptr, k=k.ptr, v=v.ptr, g=g.ptr, beta=beta.ptr, state=state.ptr, out=out.ptr,
                                sg=sg, n_groups=G, N=N, Hk=Hk, Hv=Hv, D=D, scale=float(scale))
        return out

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        """The Mamba-2 selective scan (base.py): chunked or sequential as delta_net."""
        self._f32("ssm_scan", x, dt, A, B, C, state, *([D] if D is not None else []))
        N, H, P = x.shape
        G, Ns = B.shape[1], B.shape[2]
        if (dt.size != N * H or A.size != H or B.shape != (N, G, Ns) or C.shape != (N, G, Ns)
                or tuple(state.shape[1:]) != (H, P, Ns) or H % G or (D is not None and D.size != H)):
            raise ValueError(f"ssm_scan: x {x.shape} dt {dt.shape} A {A.shape} B {B.shape} C {C.shape} "
                             f"state {state.shape}")
        if Ns > RECUR_MAX_COLS:
            raise ReflexError("unsupported_architecture", f"ssm_scan: state size {Ns} > {RECUR_MAX_COLS}")
        out = self.empty((N, H, P))
        sg, ng, T = self._seq_arg(seqs, N, state.shape[0])
        if not N:
            return out
        dptr = D.ptr if D is not None else 0
        if self._chunked_path(T):
            aqk, gc = self.empty((N, H, CHUNK_L)), self.empty((N, H))
            self.k("ssm_chunk_prep_f32")((-(-T // CHUNK_L), H, ng), (CHUNK_THREADS, 1, 1),
                                         C=C.ptr, B=B.ptr, dt=dt.ptr, A=A.ptr, Aqk=aqk.ptr, Gc=gc.ptr, sg=sg,
                                         n_groups=ng, N=N, H=H, G=G, Ns=Ns)
            kern = self.k("ssm_chunk_scan_f32")
            kern((-(-P // CHUNK_ROWS), H, ng), (CHUNK_THREADS, 1, 1),
                 kern.head(C=C.ptr, B=B.ptr, x=x.ptr, dt=dt.ptr, Aqk=aqk.ptr, Gc=gc.ptr, Dskip=dptr, state=state.ptr,
                           y=out.ptr, sg=sg),
                 n_groups=ng, N=N, H=H, P=P, G=G, Ns=Ns)
            return out
        rows = H * P
        kern = self.k("ssm_scan_f32")
        kern(((rows + RECUR_WARPS - 1) // RECUR_WARPS, ng, 1), (32 * RECUR_WARPS, 1, 1),
             kern.head(x=x.ptr, dt=dt.ptr, A=A.ptr, B=B.ptr, C=C.ptr, Dskip=dptr, state=state.ptr, y=out.ptr, sg=sg),
             n_groups=ng, N=N, H=H, P=P, G=G, Ns=Ns)
        return out

    # -- sampling ----------------------------------------------------------------
    def argmax(self, logits, out=None):
        """Index of the largest value of each row: a numpy int array (waits for the device),
        or written to the int32 device array `out` (no wait; a captured graph can hold it)."""
        n = logits.shape[-1]
        rows = logits.size // n
        dev = out if out is not None else self.empty((rows,), "int32")
        self.k("argmax_f32")((rows, 1, 1), (1024, 1, 1), x=logits.ptr, n=n, out=dev.ptr)
        return dev if out is not None else self.to_numpy(dev).reshape(logits.shape[:-1])

    def logprobs(self, logits, rows, targets, n=None):
        V = logits.shape[-1]
        n = V if n is None else int(n)
        idx = np.stack([np.asarray(rows, np.int32).reshape(-1), np.asarray(targets, np.int32).reshape(-1)])
        K = idx.shape[1]
        if not K:
            return np.empty(0)
        dev = self.asarray(idx, "int32")
        out = self.empty((K,), "float64")
        self.k("logprob_rows")((K, 1, 1), (1024, 1, 1), x=logits.ptr, ld=V, rows=dev.ptr, targets=dev.ptr + 4 * K,
                               n=n, out=out.ptr)
        return self.to_numpy(out)

    def topk(self, logits, k, n=None):
        """The k best of the first n columns of one row, best first: numpy int64 [k]."""
        n = logits.shape[-1] if n is None else int(n)
        k = max(0, min(int(k), n, TOPK_MAX))
        if not k:
            return np.empty(0, np.int64)
        nb = (n + TOPK_SLICE - 1) // TOPK_SLICE
        cv = self.empty((nb * k,))
        ci = self.empty((nb * k,), "int32")
        self.k("topk_f32")((nb, 1, 1), (256, 1, 1), x=logits.ptr, idx=0, n=n, k=k, slice=TOPK_SLICE, out_v=cv.ptr,
                           out_i=ci.ptr)
        if nb > 1:
            m = nb * k
            if m > TOPK_SLICE:  # more candidates than one block holds: sort on the host
                return host_topk(self.to_numpy(logits), k, n)
            v2 = self.empty((k,))
            i2 = self.empty((k,), "int32")
            self.k("topk_f32")((1, 1, 1), (1024, 1, 1), x=cv.ptr, idx=ci.ptr, n=m, k=k, slice=m, out_v=v2.ptr,
                               out_i=i2.ptr)
            ci = i2
        return self.to_numpy(ci)[:k].astype(np.int64)
