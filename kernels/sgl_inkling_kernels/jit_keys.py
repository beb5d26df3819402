"""Triton compile keys of kernel launches, computed from the arguments: the CPU check that serving
never meets a kernel variant warm-up did not compile.

Under the interpreter (CPU, how the tests run) nothing compiles, so `jit_watch` never fires there.
`record_keys()` instead wraps every launch (`kernel[grid](...)`) of the kernels in this package and
records the key the GPU JIT cache would look the launch up by. The rules, from Triton 3.x
(`runtime/jit.py` `create_function_from_signature` and its native `specialize_impl`; checked
against the installed Triton's own in test/kernels/test_jit_keys.py):

- a `tl.constexpr` parameter: its value;
- None: a constexpr None; a bool: type u1; a float: type fp32 (neither specialised on its value);
- an int: type i32, i64 or u64 by its range; unless the parameter is in `do_not_specialize`, the
  value 1 becomes a constexpr 1 and a multiple of 16 is marked divisible ("D"), the latter unless
  the parameter is in `do_not_specialize_on_alignment`;
- a tensor (anything with `data_ptr`): a pointer to its dtype (`*k` for a parameter annotated
  const), marked "D" when its address is a multiple of 16, unless the parameter is in either list;
- the launch options passed with the arguments (num_warps, num_stages, ...): their values.

The grid is not part of the key. Allocations start at least 64-byte aligned on the CPU and on CUDA,
so a view's alignment comes from its offset on both: the same key on either device. What this cannot
see: choices the wrappers make differently under the interpreter (tile sizes, the MoE's large-block
threshold, CUDA-only paths); warm-up covers those by construction (kernel_warmup.py).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from sgl_inkling_kernels._triton import HAS_TRITON

_INT_TYPES = ((-(2**31), 2**31, "i32"), (-(2**63), 2**63, "i64"), (2**63, 2**64, "u64"))


# Triton's names for the pointee types (its keys read "*bf16", "*i64", ...).
_DTYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "u1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}  # fmt: skip


def _dtype_name(dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def arg_key(value, *, specialize: bool = True, align: bool = True, const: bool = False) -> tuple:
    """What one non-constexpr argument contributes to the key (the rules in the module doc)."""
    if value is None:
        return ("constexpr", None)
    if isinstance(value, bool):
        return ("u1", None)
    if isinstance(value, int):
        if specialize and value == 1:
            return ("constexpr", 1)
        ty = next((t for lo, hi, t in _INT_TYPES if lo <= value < hi), None)
        if ty is None:
            raise ValueError(f"integer argument {value} does not fit 64 bits")
        return (ty, ("D" if value % 16 == 0 and align else "") if specialize else None)
    if isinstance(value, float):
        return ("fp32", None)
    if hasattr(value, "data_ptr"):
        ptr = ("*k" if const else "*") + _dtype_name(value.dtype)
        return (ptr, ("D" if value.data_ptr() % 16 == 0 and align else "") if specialize else None)
    if isinstance(value, tuple):
        return tuple(arg_key(v, specialize=specialize, align=align, const=const) for v in value)
    return ("constexpr", value)  # jit functions, dtypes and other Python objects: by value


@dataclass(frozen=True)
class LaunchKey:
    kernel: str
    args: tuple[tuple[str, tuple], ...]  # (parameter name, its part of the key), in signature order
    options: tuple[tuple[str, object], ...]

    def differences(self, other: LaunchKey) -> list[str]:
        """Parameters and options whose parts differ, as 'name: ours vs theirs'."""
        out = [f"{n}: {a} vs {b}" for (n, a), (_, b) in zip(self.args, other.args) if a != b]
        theirs = dict(other.options)
        out += [f"{n}: {v} vs {theirs.get(n)}" for n, v in self.options if theirs.get(n) != v]
        return out


def _options(kernel) -> dict:
    """do_not_specialize / do_not_specialize_on_alignment of a JITFunction or the interpreter's wrapper."""
    kw = getattr(kernel, "kwargs", None)
    if kw is None:  # a compiled-mode JITFunction
        kw = {"do_not_specialize": kernel.do_not_specialize,
              "do_not_specialize_on_alignment": kernel.do_not_specialize_on_alignment}  # fmt: skip
    return {k: set(kw.get(k) or ()) for k in ("do_not_specialize", "do_not_specialize_on_alignment")}


def launch_key(kernel, args: tuple, kwargs: dict) -> LaunchKey:
    """The compile key of `kernel[grid](*args, **kwargs)`."""
    sig = inspect.signature(kernel.fn)
    names = list(sig.parameters)
    options = {k: v for k, v in kwargs.items() if k not in sig.parameters}
    bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    lists = _options(kernel)
    parts = []
    for i, name in enumerate(names):
        ann = sig.parameters[name].annotation
        ann = "" if ann is inspect.Parameter.empty else ann if isinstance(ann, str) else ann.__name__
        value = bound.arguments[name]
        if "constexpr" in ann:
            parts.append((name, ("constexpr", value)))
            continue
        if ann and "const" not in ann:  # Triton keys typed parameters by their annotation: not modelled here
            raise NotImplementedError(f"{kernel.fn.__name__}: parameter {name} is annotated {ann!r}")
        dns = i in lists["do_not_specialize"] or name in lists["do_not_specialize"]
        dnsa = i in lists["do_not_specialize_on_alignment"] or name in lists["do_not_specialize_on_alignment"]
        parts.append((name, arg_key(value, specialize=not dns, align=not dnsa, const=bool(ann))))
    return LaunchKey(kernel.fn.__name__, tuple(parts), tuple(sorted(options.items())))


def package_kernels() -> list:
    """Every @triton.jit function defined in this package's modules (device helpers included:
    only launched ones record anything)."""
    if not HAS_TRITON:
        return []
    from triton.runtime.jit import KernelInterface

    import sgl_inkling_kernels as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, KernelInterface) and obj.fn.__module__ == mod.__name__:
                found[id(obj)] = obj
    return list(found.values())


@dataclass
class KeyLog:
    launches: list[LaunchKey] = field(default_factory=list)

    def keys(self) -> set[LaunchKey]:
        return set(self.launches)

    def new_since(self, seen: set[LaunchKey]) -> list[str]:
        """One line per distinct key not in `seen`: the kernel and what differs from its nearest seen key."""
        out, done = [], set()
        for k in self.launches:
            if k in seen or k in done:
                continue
            done.add(k)
            same = [s for s in seen if s.kernel == k.kernel]
            nearest = min(same, key=lambda s: len(k.differences(s)), default=None)
            why = "; ".join(k.differences(nearest)) if nearest else "never launched before"
            out.append(f"{k.kernel}: {why}")
        return out


@contextlib.contextmanager
def record_keys() -> Iterator[KeyLog]:
    """Within the block, every launch of a package kernel appends its key to the log (the launch
    itself runs as usual)."""
    log = KeyLog()
    kernels = package_kernels()

    def wrap(kernel):
        run = kernel.run

        def recorded(*args, grid, warmup, **kwargs):
            if not warmup:
                log.launches.append(launch_key(kernel, args, kwargs))
            return run(*args, grid=grid, warmup=warmup, **kwargs)

        return recorded

    for k in kernels:
        k.run = wrap(k)  # an instance attribute: `kernel[grid]` looks `run` up on the instance
    try:
        yield log
    finally:
        for k in kernels:
            del k.run
