"""Reading the table of contents of a CUDA fatbin, without the CUDA toolkit.

A fatbin is one or more containers (magic 0xBA55ED50, u16 version, u16 header size,
u64 payload size), each holding entries: u16 kind (1 = PTX, 2 = ELF machine code),
u16, u32 header size, u64 payload size, ..., u32 architecture at byte 28, u64 flags
at byte 40 (bit 0x8000 or 0x2000: compressed). Used by `reflex doctor`, `reflex smoke`
and the build tests to say which images the package carries.
"""

import struct

MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "sm"}


class FatbinError(ValueError):
    pass


def images(data: bytes) -> list[dict]:
    """[{"kind": "sm"|"ptx", "arch": 90, "bytes": n, "compressed": bool}, ...] in file order."""
    out = []
    off = 0
    n = len(data)
    while off + 16 <= n:
        magic, _ver, hsize, size = struct.unpack_from("<IHHQ", data, off)
        if magic != MAGIC:
            if out and not any(data[off:]):  # zero padding after the last container
                break
            raise FatbinError(f"bad fatbin magic {magic:#x} at byte {off}")
        end = off + hsize + size
        if end > n:
            raise FatbinError(f"container at byte {off} runs past the end ({end} > {n})")
        e = off + hsize
        while e < end:
            if e + 48 > end:
                raise FatbinError(f"truncated entry header at byte {e}")
            kind, _, ehs, esize = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            flags = struct.unpack_from("<Q", data, e + 40)[0]
            if ehs < 48 or e + ehs + esize > end:
                raise FatbinError(f"entry at byte {e} runs past its container")
            out.append({"kind": KIND.get(kind, f"kind{kind}"), "arch": arch, "bytes": esize,
                        "compressed": bool(flags & 0xA000)})
            e += ehs + esize
        off = end
    if not out:
        raise FatbinError("no images in the fatbin")
    return out


def read_images(path: str) -> list[dict]:
    with open(path, "rb") as fh:
        return images(fh.read())


def chosen_image(imgs: list[dict], cc: tuple) -> str:
    """The image the driver loads on a device of compute capability cc=(major, minor):
    machine code for the same major version and the highest minor <= the device's,
    else PTX of the highest version <= the device's (compiled by the driver: JIT)."""
    dev = cc[0] * 10 + cc[1]
    sass = [i["arch"] for i in imgs if i["kind"] == "sm" and i["arch"] // 10 == cc[0] and i["arch"] <= dev]
    if sass:
        return f"sm_{max(sass)}"
    ptx = [i["arch"] for i in imgs if i["kind"] == "ptx" and i["arch"] <= dev]
    if ptx:
        return f"compute_{max(ptx)} (PTX, JIT by the driver)"
    return "none (no compatible image)"
