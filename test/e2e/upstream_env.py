"""A separate environment with upstream SGLang's client side (`pip install --no-deps sglang==0.5.23`).

Upstream's package provides the `sglang` module too, so it cannot share this project's environment.
The new environment installs upstream's wheel without its dependencies, then sees this
environment's packages (torch, transformers, requests, ...) after its own through a .pth file, and
adds the few client dependencies that upstream's frontend and bench_serving import and that are not
here, constrained to this environment's versions so nothing here is replaced.

bench_serving imports torchvision at start (through SGLang's VLM configs, never for text datasets).
This environment's torch is the CPU build, for which the package index has no matching torchvision,
so the client environment gets a placeholder package that raises if any of its code is used.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

UPSTREAM = "sglang==0.5.23"
# What upstream's sglang.lang and sglang.bench_serving import that this project does not install.
CLIENT_DEPS = ["psutil", "pybase64", "msgspec", "IPython", "datasets", "sentencepiece", "compressed-tensors", "gguf"]
# pip's words for a package index it cannot reach (the one reason to skip rather than fail).
_OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
            "Max retries exceeded", "ConnectTimeout")  # fmt: skip

_PLACEHOLDER = '''"""Placeholder torchvision: the real one needs a CUDA torch. Any submodule imports; using anything raises."""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+placeholder"


class _Unavailable:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is a placeholder in this client environment")


class _Module(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _Module
'''


class IndexUnreachable(RuntimeError):
    pass


def _pip(python: Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        out = proc.stdout + proc.stderr
        if any(word in out for word in _OFFLINE):
            raise IndexUnreachable(out[-2000:])
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{out[-4000:]}")


def _site_packages(python: Path) -> Path:
    out = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(out.decode().strip())


def build_upstream_env(root: Path) -> Path:
    """Create the environment under `root`; returns its python."""
    venv.create(root, with_pip=True)
    python = root / "bin" / "python"
    site = _site_packages(python)
    (site / "zz_host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    freeze = subprocess.check_output([sys.executable, "-m", "pip", "freeze"], text=True).splitlines()
    constraints = root / "constraints.txt"
    constraints.write_text("\n".join(line for line in freeze if "==" in line and "@" not in line) + "\n")
    _pip(python, "--no-deps", UPSTREAM)
    _pip(python, "-c", str(constraints), *CLIENT_DEPS)
    (site / "torchvision").mkdir()
    (site / "torchvision" / "__init__.py").write_text(_PLACEHOLDER)
    return python


def run_upstream(python: Path, *args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run upstream's python with no trace of this project's sources on the path."""
    env = {k: v for k, v in kw.pop("env", {}).items()}
    base = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(python), *args], env={**base, **env}, capture_output=True, text=True, timeout=timeout,
        cwd=str(python.parent), **kw,
    )  # fmt: skip
