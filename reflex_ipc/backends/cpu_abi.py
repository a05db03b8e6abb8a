"""The C ABI of the cpu backend's library (kernels/cpu/*.c -> libreflex_cpu.so), declared once.

Each exported C function is one line of FUNCTIONS: its name, its replay code, its C return
type and its C parameters, written as C. From this table `python3 kernels/cpu/build.py`
generates, before compiling:

- kernels/cpu/rx_abi.h: the structs, the prototypes (the compiler checks every definition
  in ops.c against them, and ops.c is compiled with -Werror=missing-prototypes, so an
  exported function missing here fails the build), the replay codes and rx_run's dispatch
  of one recorded command (`rx_replay_one`);
- reflex_ipc/backends/cpu_launch.py: the ctypes argument and result types, the ABI version
  the library must report, and a method per function with keyword-only arguments named as
  in C (cpu_ops.CpuOps inherits them): a missing or unknown argument is a TypeError, a value
  of the wrong kind a ctypes.ArgumentError; a recorded function appends its call to the
  graph being recorded and turns a non-zero int result into an error.

tests/test_cpu_abi.py fails when either generated file differs from what this table gives.
Nothing here is imported at run time (only the generated module is).

Adding a C function: its line here, its definition in ops.c (RX_EXPORT), then
`python3 kernels/cpu/build.py`; its Python caller calls `self.rx_<name>(param=...)`.
Replay code: the op code of a recorded graph command (rx_run), 0 for a function that is not
recorded. A recorded function returns void, or int: 0, or a negative error.
Parameter types: pointers (any `T *`), int64_t, int, float, double.
"""

# struct name -> its fields, as C declarations (one ctypes Structure each)
STRUCTS = {
    # a weight: M rows of K values of ggml type `type`, row r at data + r * row_bytes
    "rx_weight": "int64_t type; const uint8_t *data; int64_t M; int64_t K; int64_t row_bytes",
}

# A recorded command is CMD_WIDTH int64 words: the replay code, then the arguments (pointers
# and integers as they are, float and double as the bits of a double).
CMD_WIDTH = 24

# name -> (replay code, C return type, C parameters)
FUNCTIONS = {
    # the library
    "rx_abi_version": (0, "int", "void"),
    "rx_isa_name": (0, "const char *", "void"),
    "rx_set_isa": (0, "int", "const char *name"),  # "auto", "generic", "avx2": 0, else -1
    "rx_set_threads": (0, "int", "int n"),
    "rx_threads": (0, "int", "void"),
    "rx_set_spin": (0, "void", "int64_t worker_ns, int64_t wait_ns"),
    "rx_solo_jobs": (0, "int64_t", "void"),
    "rx_pool_stats": (0, "int64_t", "int64_t *out, int64_t n, int64_t reset"),  # ops.c's POOL_STAT_* counters
    "rx_act_format": (0, "int", "int64_t type"),
    "rx_run": (0, "int", "const int64_t *cmds, int64_t n, int64_t stride"),
    # linear algebra
    "rx_matmul": (1, "int", "int64_t N, int64_t K, const float *x, int64_t ldx, int64_t nw, const rx_weight *w0, "
                  "const rx_weight *w1, const rx_weight *w2, float *y0, float *y1, float *y2, int64_t mode, "
                  "int64_t accumulate"),
    "rx_dot": (0, "float", "const rx_weight *w, int64_t row, const float *x"),
    "rx_embed": (6, "int", "const rx_weight *w, const int32_t *ids, int64_t N, float *out, float scale"),
    # normalization, rotary
    "rx_norm_rope": (2, "void", "float *x, int64_t N, int64_t H, int64_t hd, const int32_t *pos, int64_t n_rot, "
                     "double base, double freq_scale, const float *ff, int64_t neox, double mscale, int64_t norm, "
                     "const float *w, float eps"),
    "rx_rms_norm": (3, "void", "const float *x, float *y, const float *w, int64_t R, int64_t D, float eps"),
    # KV cache, attention
    "rx_kv_store": (4, "void", "void *kc, void *vc, const float *k, const float *v, const int32_t *slots, int64_t N, "
                    "int64_t Hkv, int64_t n_slots, int64_t hdk, int64_t hdv, int64_t f16"),
    "rx_attention": (5, "void", "const float *q, const void *kc, const void *vc, float *out, const int32_t *pos, "
                     "const float *mask, int64_t N, int64_t Hq, int64_t Hkv, int64_t n_slots, int64_t hdk, "
                     "int64_t hdv, int64_t n_kv, float scale, float softcap, int64_t causal, int64_t window, "
                     "int64_t f16, const float *sinks, int64_t chunk"),
    "rx_attention_latent": (0, "void", "const float *q, const void *kc, float *out, const int32_t *pos, "
                            "const float *mask, int64_t N, int64_t Hq, int64_t n_slots, int64_t hdk, int64_t hdv, "
                            "int64_t n_kv, float scale, float softcap, int64_t causal, int64_t window, int64_t f16"),
    "rx_to_f16": (0, "void", "const float *x, uint16_t *y, int64_t n"),
    # element-wise (rx_binary op: 0 add, 1 mul; rx_unary op: 0 scale, 1 softcap, 2 silu, 3 gelu,
    # 4 swiglu, 5 geglu, 6 sigmoid, 7 softplus)
    "rx_binary": (7, "void", "int64_t op, const float *a, const float *b, float *out, int64_t n, int64_t nb"),
    "rx_unary": (8, "void", "int64_t op, const float *a, const float *b, float *out, int64_t n, float p"),
    "rx_copy": (9, "void", "const void *src, void *dst, int64_t bytes"),
    "rx_argmax": (10, "void", "const float *x, int64_t rows, int64_t V, int32_t *out"),
    "rx_columns": (14, "void", "const float *src, float *dst, int64_t rows, int64_t cols, int64_t start, int64_t n"),
    # recurrent layers
    "rx_ssm_conv": (11, "void", "const float *x, float *state, const float *w, float *out, const int32_t *tab, "
                    "int64_t G, int64_t N, int64_t C, int64_t K"),
    "rx_delta_net": (12, "void", "const float *q, const float *k, const float *v, const float *g, const float *beta, "
                     "float *state, float *out, const int32_t *tab, int64_t G, int64_t N, int64_t Hk, int64_t Hv, "
                     "int64_t D, float scale"),
    "rx_ssm_scan": (13, "void", "const float *x, const float *dt, const float *A, const float *B, const float *C, "
                    "const float *Dp, float *state, float *out, const int32_t *tab, int64_t G, int64_t N, int64_t H, "
                    "int64_t P, int64_t Ng, int64_t Ns"),
}


# ---------------------------------------------------------------------------------------------
# The generator (build time and tests only)

_SCALARS = {"int64_t": "c_int64", "int": "c_int", "float": "c_float", "double": "c_double"}
HEADER = "kernels/cpu/rx_abi.h"
MODULE = "reflex_ipc/backends/cpu_launch.py"


def _param(decl):
    """(C type, name, kind) of one C parameter; kind "ptr", "int64_t", "int", "float" or "double"."""
    decl = " ".join(decl.split())
    head, sep, name = decl.rpartition(" ")
    while name.startswith("*"):
        head, name = head + " *", name[1:]
    ctype = " ".join(head.replace("*", " * ").split()).replace("* *", "**")
    if not sep or not name.isidentifier() or not ctype:
        raise ValueError(f"cannot read the C parameter {decl!r}")
    if "*" in ctype:
        return ctype, name, "ptr"
    if ctype not in _SCALARS:
        raise ValueError(f"parameter {decl!r}: type {ctype!r} is not a pointer, {', '.join(_SCALARS)}")
    return ctype, name, ctype


def _decl(ctype, name):
    return f"{ctype}{name}" if ctype.endswith("*") else f"{ctype} {name}"


def params(name):
    """[(C type, name, kind)] of FUNCTIONS[name]'s parameters."""
    text = FUNCTIONS[name][2].strip()
    return [] if text == "void" else [_param(p) for p in text.split(",")]


def _restype(ret):
    ret = " ".join(ret.split())
    if ret == "void":
        return "None"
    if ret == "const char *":
        return "c_char_p"
    if ret in _SCALARS:
        return _SCALARS[ret]
    raise ValueError(f"return type {ret!r} is not void, const char * or {', '.join(_SCALARS)}")


def check():
    """Errors of the table itself: codes, widths, names, types."""
    codes = {}
    for name, (code, ret, _) in FUNCTIONS.items():
        if not name.startswith("rx_") or not name.isidentifier():
            raise ValueError(f"{name}: exported names start with rx_")
        _restype(ret)
        ps = params(name)
        if len({p[1] for p in ps}) != len(ps):
            raise ValueError(f"{name}: a parameter name repeats")
        if code:
            if code in codes:
                raise ValueError(f"{name}: replay code {code} is also {codes[code]}'s")
            codes[code] = name
            if len(ps) > CMD_WIDTH - 1:
                raise ValueError(f"{name}: {len(ps)} parameters do not fit a command of {CMD_WIDTH}")
            if ret not in ("void", "int"):
                raise ValueError(f"{name}: a recorded function returns void or int (a status)")
    for sname, fields in STRUCTS.items():
        for f in fields.split(";"):
            _param(f)


def abi_version():
    """A number that changes with the table (the library reports it; cpu_launch checks it)."""
    import zlib

    text = repr((sorted(STRUCTS.items()), sorted(FUNCTIONS.items()), CMD_WIDTH))
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _op_name(name):
    return name[3:].upper()


def c_header():
    check()
    out = ["/* Generated by kernels/cpu/build.py from reflex_ipc/backends/cpu_abi.py: do not edit. */",
           "#ifndef RX_ABI_H", "#define RX_ABI_H", "", "#include <stdint.h>", "#include <string.h>", "",
           f"#define RX_ABI_VERSION {abi_version()}", f"#define RX_CMD_WIDTH {CMD_WIDTH}",
           '#define RX_API __attribute__((visibility("default")))', ""]
    for sname, fields in STRUCTS.items():
        out.append("typedef struct {")
        out += [f"    {_decl(t, n)};" for t, n, _ in (_param(f) for f in fields.split(";"))]
        out += [f"}} {sname};", ""]
    recorded = sorted((code, name) for name, (code, _, _) in FUNCTIONS.items() if code)
    out.append("/* replay codes of recorded commands */")
    out.append("enum {")
    out += [f"    RX_OP_{_op_name(name)} = {code}," for code, name in recorded]
    out += ["};", ""]
    for name, (_, ret, _) in FUNCTIONS.items():
        ps = params(name)
        plist = ", ".join(_decl(t, n) for t, n, _ in ps) or "void"
        out.append(f"RX_API {_decl(ret, name)}({plist});")
    out += ["", "#ifdef RX_ABI_REPLAY",
            "static inline double rx_abi_double(int64_t v) {", "    double d;", "    memcpy(&d, &v, sizeof d);",
            "    return d;", "}", "",
            "/* Run one recorded command a[0..RX_CMD_WIDTH-1]: 0, -1 when the function reported an error,",
            " * -2 for an unknown code. */",
            "static int rx_replay_one(const int64_t *a) {", "    switch (a[0]) {"]
    for code, name in recorded:
        args = []
        for i, (t, _, kind) in enumerate(params(name), 1):
            if kind == "ptr":
                args.append(f"({t})(intptr_t)a[{i}]")
            elif kind == "float":
                args.append(f"(float)rx_abi_double(a[{i}])")
            elif kind == "double":
                args.append(f"rx_abi_double(a[{i}])")
            elif kind == "int":
                args.append(f"(int)a[{i}]")
            else:
                args.append(f"a[{i}]")
        call = f"{name}({', '.join(args)})"
        out.append(f"    case RX_OP_{_op_name(name)}:")
        out.append(f"        return {call} ? -1 : 0;" if FUNCTIONS[name][1] == "int" else f"        {call};")
        if FUNCTIONS[name][1] != "int":
            out.append("        return 0;")
    out += ["    default:", "        return -2;", "    }", "}", "#endif /* RX_ABI_REPLAY */", "", "#endif", ""]
    return "\n".join(out)


def python_module():
    check()
    q = '"""'
    out = [f"{q}Generated by kernels/cpu/build.py from reflex_ipc/backends/cpu_abi.py: do not edit.",
           "",
           "The cpu library's functions with keyword arguments (cpu_ops.CpuOps inherits Launchers),",
           f"their ctypes types, and the version the library must report.{q}",
           "",
           "from ctypes import Structure, c_char_p, c_double, c_float, c_int, c_int64, c_void_p  # noqa: F401",
           "",
           f"ABI_VERSION = {abi_version()}",
           f"CMD_WIDTH = {CMD_WIDTH}", ""]
    for sname, fields in STRUCTS.items():
        cls = "".join(w.capitalize() for w in sname.split("_"))
        fl = ", ".join(f'("{n}", {"c_void_p" if k == "ptr" else _SCALARS[k]})'
                       for _, n, k in (_param(f) for f in fields.split(";")))
        out += ["", f"class {cls}(Structure):", f"    _fields_ = [{fl}]", ""]
    out += ["", "# name -> (argument types, result type)", "SIGNATURES = {"]
    for name, (_, ret, _) in FUNCTIONS.items():
        ts = ", ".join("c_void_p" if k == "ptr" else _SCALARS[k] for _, _, k in params(name))
        out.append(f'    "{name}": ([{ts}], {_restype(ret)}),')
    out += ["}", "", "# replay code -> name, and the argument positions (1-based) that hold a float or double",
            "OPS = {"]
    recorded = sorted((code, name) for name, (code, _, _) in FUNCTIONS.items() if code)
    for code, name in recorded:
        out.append(f'    {code}: "{name}",')
    out += ["}", "FLOAT_ARGS = {"]
    for code, name in recorded:
        fl = tuple(i for i, (_, _, k) in enumerate(params(name), 1) if k in ("float", "double"))
        out.append(f"    {code}: {fl!r},")
    out += ["}"]
    out += [f"{_op_name(name)} = {code}" for code, name in recorded]
    names = list(FUNCTIONS)
    out += ["", "# the library's functions (ctypes), set by bind(lib) once cpu_ops has loaded and typed them:",
            "# module globals, the cheapest lookup for the launchers below",
            " = ".join(f"_{n}" for n in names) + " = None", "", "",
            "def bind(lib):",
            f"    global {', '.join(f'_{n}' for n in names)}"]
    out += [f"    _{n} = lib.{n}" for n in names]
    out += ["", "", "class Launchers:",
            '    """The library\'s functions as methods with keyword-only arguments (after bind). The class',
            "    using it sets _rec (None, or the list a recording appends (code, args) to) and",
            '    _failed(code, rc) (raises: a recorded function returned an error)."""',
            "", "    __slots__ = ()"]
    for name, (code, ret, _) in FUNCTIONS.items():
        ps = [n for _, n, _ in params(name)]
        sig = ", ".join(["self"] + (["*"] + ps if ps else []))
        call = f"_{name}({', '.join(ps)})"
        out += ["", f"    def {name}({sig}):"]
        if code:
            tup = ", ".join(ps) + ("," if len(ps) == 1 else "")
            out += ["        if self._rec is not None:", f"            self._rec.append(({code}, ({tup})))"]
            if ret == "int":
                out += [f"        rc = {call}", "        if rc:", f"            self._failed({code}, rc)",
                        "        return rc"]
            else:
                out.append(f"        {call}")
        else:
            out.append(f"        return {call}")
    out.append("")
    return "\n".join(out)


def outputs():
    """{path relative to the repository: text} of the generated files."""
    return {HEADER: c_header(), MODULE: python_module()}
