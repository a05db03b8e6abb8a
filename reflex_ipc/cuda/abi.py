"""The CUDA kernels' ABI, declared once: in the kernel sources (kernels/*.cuh, `RX_EXTERN`).

`python -m reflex_ipc.cuda.abi` runs the C preprocessor over each translation unit nvcc
compiles (UNITS: kernels/all.cu, the main fatbin; kernels/iq_all.cu, the IQ formats' fatbin,
loaded only for models that need it; macros expanded, so a family instantiated by a macro
yields each of its kernels), reads every `extern "C" __global__` definition, and writes
reflex_ipc/cuda/launch.py: for each kernel its argument layout (a struct format: pointers Q,
long long q, int i, unsigned I, float f, double d) and its launcher, a function with the
kernel's parameters as keyword-only arguments, named as in the source, and for the kernels
of the other fatbins the file that holds them (MODULE_OF):

    rt.kernel("mm1_q8_0")(grid, block, W=w.ptr, X=x.ptr, Y=y.ptr, K=K, M=M, N=1, rb=rb, acc=0)

(a kernel of more than MAX_KW parameters takes its leading ones through `k.head(...)`: see
MAX_KW below).
A missing or unknown argument is a TypeError (Python's own call check, no cost per launch), a
value of the wrong kind (a float for an int, a negative or non-integer pointer) struct.error
when the arguments are packed (as before). kernels/build.py runs the same reading before
nvcc and refuses to build when launch.py is stale; tests/test_cuda_abi.py too (and the PTX
check of tests/test_kernels_build.py compares the compiled parameter lists).

Adding a kernel: write it (RX_EXTERN) and run `python -m reflex_ipc.cuda.abi`; call it from
cuda_ops with keyword arguments. Never imported at run time (only launch.py is).
"""

import keyword
import os
import re
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS_DIR = os.path.join(ROOT, "kernels")
MODULE = os.path.join("reflex_ipc", "cuda", "launch.py")
RESERVED = {"grid", "block", "shared", "self"}  # the launcher's own arguments

_EXTERN = re.compile(r'extern\s+"C"\s+__global__\s+void\s+')
# the translation units kernels/build.py compiles, each into its fatbin (the first: the main
# one, loaded at start; the others when a kernel of theirs is first used: cuda/core.py)
UNITS = (("all.cu", "reflex_kernels.fatbin"), ("iq_all.cu", "reflex_kernels_iq.fatbin"))


class AbiError(Exception):
    pass


def find_cpp():
    """A command that runs the C preprocessor on C++ input, or None."""
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang", "cpp"):
        if cc and shutil.which(cc.split()[0]):
            return cc.split() + ["-E"] if not cc.endswith("cpp") else [cc]
    return None


def preprocess(kernels_dir=KERNELS_DIR, cpp=None, unit="all.cu"):
    """kernels/<unit> with its includes and macros expanded (cuda_fp16.h stubbed out; read as C:
    only the preprocessor runs, so no C++ front end is needed)."""
    cpp = cpp or find_cpp()
    if cpp is None:
        raise AbiError("no C preprocessor (cc, gcc, clang or cpp) to read the kernel sources")
    with tempfile.TemporaryDirectory() as stub:
        open(os.path.join(stub, "cuda_fp16.h"), "w").close()
        r = subprocess.run([*cpp, "-P", "-x", "c", "-I", stub, os.path.join(kernels_dir, unit)],
                           capture_output=True, text=True)
    if r.returncode:
        raise AbiError(f"the preprocessor failed on kernels/{unit}:\n{r.stderr[-2000:]}")
    return r.stdout


def _code(ctype, where):
    t = " ".join(ctype.replace("__restrict__", " ").replace("const", " ").split())
    if "*" in t:
        return "Q"
    code = {"int": "i", "long long": "q", "unsigned int": "I", "unsigned": "I", "float": "f",
            "double": "d"}.get(t)
    if code is None:
        raise AbiError(f"{where}: parameter type {ctype!r} has no launch layout (pointer, int, long long, "
                       "unsigned, float, double)")
    return code


def _balanced(text, i):
    """The index after the parenthesized group starting at text[i] == '('."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    raise AbiError("unbalanced parentheses in the kernel sources")


def kernels(text):
    """{name: [(parameter name, struct code)]} of every extern "C" __global__ definition."""
    out = {}
    for m in _EXTERN.finditer(text):
        i = m.end()
        if text.startswith("__launch_bounds__", i):
            i = _balanced(text, text.index("(", i))
        nm = re.compile(r"\s*(\w+)\s*\(").match(text, i)
        if not nm:
            raise AbiError(f"cannot read the kernel after: {text[m.start():m.start() + 120]!r}")
        name = nm.group(1)
        end = _balanced(text, nm.end() - 1)
        params = []
        plist = text[nm.end():end - 1].strip()
        for p in ([] if plist in ("", "void") else plist.split(",")):
            pm = re.fullmatch(r"\s*(.*?[\s*&])(\w+)\s*", p)
            if not pm:
                raise AbiError(f"{name}: cannot read the parameter {p.strip()!r}")
            pname = pm.group(2)
            if keyword.iskeyword(pname) or pname in RESERVED:
                raise AbiError(f"{name}: a parameter may not be named {pname!r} (the launcher's own)")
            params.append((pname, _code(pm.group(1), f"{name}({pname})")))
        if name in out and out[name] != params:
            raise AbiError(f"{name} is defined twice with different parameters")
        if len({p for p, _ in params}) != len(params):
            raise AbiError(f"{name}: a parameter name repeats")
        out[name] = params
    if not out:
        raise AbiError("no extern \"C\" __global__ kernels found in kernels/all.cu")
    return out


# CPython passes a call's arguments on the stack only while positional + 2 * keyword arguments
# stay within 30 (its compiler's STACK_USE_GUIDELINE); beyond, the call builds a dict and takes
# a path about 3x as slow for a 19-argument launch. A kernel of more than MAX_KW parameters
# therefore takes its leading ones (its pointers, the buffers, and more when the rest would still
# be too many) through the launcher's `head`, as one positional argument, and the rest by name:
#     k = rt.kernel("attention_split_last_f16kv")
#     k(grid, block, k.head(q=..., kc=..., ..., mask=...), Hq=..., ..., chunk=...)
MAX_KW = 14
MAX_REST = (30 - 3) // 2  # the named parameters after grid, block and head: 13


def split_point(params):
    """0 (every parameter by name in one call) or the number of leading ones `head` takes."""
    if len(params) <= MAX_KW:
        return 0
    lead = next((i for i, (_, c) in enumerate(params) if c != "Q"), len(params))
    cut = max(lead, len(params) - MAX_REST)
    if cut > MAX_KW:
        raise AbiError(f"a kernel of {len(params)} parameters is more than a launcher can name on CPython's fast "
                       f"path ({MAX_KW + MAX_REST}; abi.MAX_KW): {[p for p, _ in params]}")
    return cut


def launch_module(ks, module_of=None):
    """The text of reflex_ipc/cuda/launch.py for kernels `ks` (kernels()); module_of: {kernel:
    fatbin file} for the kernels outside the main fatbin."""
    sigs = {}
    for name in sorted(ks):
        sigs.setdefault(tuple(ks[name]), []).append(name)
    fid = {s: f"_{sigs[s][0]}" for s in sigs}  # a factory is named after its first kernel
    q = '"""'
    out = [f"{q}Generated by `python -m reflex_ipc.cuda.abi` from the kernel sources (kernels/*.cuh): do not",
           "edit. Each kernel's argument layout and launcher: see reflex_ipc/cuda/abi.py.",
           "",
           "A launcher factory takes (launch, pack, stream): the driver's launch function, the kernel's",
           "struct pack (the C parameter layout) and the stream. The launcher it returns is called as",
           "`kernel(grid, block, <parameters by name>, shared=0)`; a kernel of more than",
           f"{MAX_KW} parameters takes its leading ones through `kernel.head(<them by name>)` as the third",
           f"positional argument (abi.MAX_KW: CPython's fast path for keyword arguments).{q}", ""]
    for s in sorted(sigs, key=lambda s: sigs[s][0]):
        names = [p for p, _ in s]
        cut = split_point(s)
        more = f"  # {len(sigs[s])} kernels" if len(sigs[s]) > 1 else ""
        out += ["", f"def {fid[s]}(launch, pack, stream):{more}"]
        if not cut:
            out += [f"    def kernel(grid, block, *{', ' + ', '.join(names) if names else ''}, shared=0):",
                    f"        return launch(grid, block, pack({', '.join(names)}), shared, stream)", ""]
        else:
            head, rest = names[:cut], names[cut:]
            out += [f"    def head(*, {', '.join(head)}):",
                    f"        return ({', '.join(head)})", "",
                    f"    def kernel(grid, block, head, *, {', '.join(rest)}, shared=0):",
                    f"        if len(head) != {cut}:",
                    f'            raise TypeError("{sigs[s][0]}: the third argument must be kernel.head(...)")',
                    f"        return launch(grid, block, pack(*head, {', '.join(rest)}), shared, stream)", "",
                    "    kernel.head = head"]
        out += ["    return kernel", ""]
    out += ["", "# kernel name -> (struct format of its arguments, launcher factory)", "KERNELS = {"]
    for name in sorted(ks):
        fmt = "".join(c for _, c in ks[name])
        out.append(f'    "{name}": ("{fmt}", {fid[tuple(ks[name])]}),')
    out += ["}", "", "# the kernels of the other fatbins (cuda/core.py loads one when a kernel of it is first used):",
            "# kernel name -> fatbin file", "MODULE_OF = {"]
    for name in sorted(module_of or {}):
        out.append(f'    "{name}": "{module_of[name]}",')
    out += ["}", ""]
    return "\n".join(out)


def unit_kernels(kernels_dir=KERNELS_DIR, cpp=None):
    """({name: parameters} of every unit's kernels, {name: fatbin file} for the non-main units)."""
    ks, module_of = {}, {}
    for i, (unit, fatbin) in enumerate(UNITS):
        for name, params in kernels(preprocess(kernels_dir, cpp, unit)).items():
            if name in ks:
                raise AbiError(f"{name} is defined in two translation units ({unit} and another)")
            ks[name] = params
            if i:
                module_of[name] = fatbin
    return ks, module_of


def expected(kernels_dir=KERNELS_DIR, cpp=None):
    return launch_module(*unit_kernels(kernels_dir, cpp))


def check(kernels_dir=KERNELS_DIR, root=ROOT, cpp=None):
    """Raise AbiError when reflex_ipc/cuda/launch.py is not what the kernel sources give."""
    want = expected(kernels_dir, cpp)
    try:
        with open(os.path.join(root, MODULE)) as fh:
            have = fh.read()
    except OSError:
        have = None
    if have != want:
        raise AbiError(f"{MODULE} does not match the kernel sources: run python -m reflex_ipc.cuda.abi")


def write(kernels_dir=KERNELS_DIR, root=ROOT, cpp=None):
    """Write launch.py from the kernel sources; True when it changed."""
    text = expected(kernels_dir, cpp)
    path = os.path.join(root, MODULE)
    try:
        with open(path) as fh:
            if fh.read() == text:
                return False
    except OSError:
        pass
    with open(path, "w") as fh:
        fh.write(text)
    return True


if __name__ == "__main__":
    print(f"{MODULE}: {'written' if write() else 'already current'}")
