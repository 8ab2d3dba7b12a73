"""docs/deepseek-0.9.1.md against the artifacts it cites (issue 46, groundwork of the DeepSeek 0.9.1 base).

The document maps every patch of the DeepSeek 0.7.1 series onto verl 0.9.1 and says where the recipe's
optimisations hook in, citing lines as `PATH:LINE TEXT`: a bare PATH in verl 0.9.1's sdist, `PKG-VER/PATH` in
that package's sdist or wheel from the index. Each citation is re-read here; TEXT must be on that line. And every
patch of the 0.7.1 series (and each 0.6.0 one 0.7.1 does not port) must have a row with its fate.
"""

from __future__ import annotations

import re
import tarfile
import tomllib
import zipfile
from functools import cache
from pathlib import Path

import pytest

from ascend_rl import artifacts
from ascend_rl.paths import REPO
from ci_policy import get_artifact

# the vllm-ascend sdist and the Megatron wheels are downloads on a fresh machine
pytestmark = pytest.mark.slow

DOC = REPO / "docs" / "deepseek-0.9.1.md"
MANIFEST = REPO / "llm_rl" / "deepseek_r1" / "recipe.toml"
BASE = "0.9.1"

# `PATH:LINE TEXT` or `PKG-VER/PATH:LINE TEXT` (an sdist's folder name; PKG==VER is a pin, which only the
# constraints files write: tests/launch/test_stack.py), in backticks; TEXT runs to the closing backtick.
CITATION = re.compile(
    r"`(?:(?P<pkg>[a-z][a-z0-9-]*)-(?P<ver>[0-9][0-9a-z.]*)/)?"
    r"(?P<path>[A-Za-z0-9_][A-Za-z0-9_./-]*):(?P<line>[0-9]+) (?P<text>[^`]+)`"
)

# Where each package's files come from: the index's file name, read as an archive (never installed).
ARCHIVES = {
    "vllm-ascend": lambda v: artifacts.vllm_ascend_sdist(v),
    "megatron-core": lambda v: artifacts.index_file(
        "megatron-core", f"megatron_core-{v}-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
    ),
    "megatron-bridge": lambda v: artifacts.index_file(
        "megatron-bridge", f"megatron_bridge-{v}-py3-none-any.whl"
    ),
    "mbridge": lambda v: artifacts.index_file("mbridge", f"mbridge-{v}-py3-none-any.whl"),
}


def citations() -> list[re.Match]:
    return list(CITATION.finditer(DOC.read_text(encoding="utf-8")))


@cache
def _archive_lines(archive: Path, member: str) -> list[str] | None:
    """The lines of `member` (a path inside the package) of a wheel or an sdist; None when it has none."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            try:
                return zf.read(member).decode("utf-8").splitlines()
            except KeyError:
                return None
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]  # an sdist holds one folder, <name>-<version>/
        try:
            handle = tar.extractfile(f"{top}/{member}")
        except KeyError:
            return None
        return None if handle is None else handle.read().decode("utf-8").splitlines()


@pytest.fixture(scope="module")
def source(pristine_base):
    """source(pkg, ver, path) -> the cited file's lines, or None when the artifact has no such file."""
    verl = pristine_base(BASE)
    archives: dict[tuple[str, str], Path] = {}

    def lines(pkg: str | None, ver: str | None, path: str) -> list[str] | None:
        if pkg is None:
            file = verl / path
            return file.read_text(encoding="utf-8").splitlines() if file.is_file() else None
        if (pkg, ver) not in archives:
            archives[pkg, ver] = get_artifact(f"{pkg} {ver}", ARCHIVES[pkg], ver)
        return _archive_lines(archives[pkg, ver], path)

    return lines


def test_the_document_cites_every_source_it_names():
    found = citations()
    packages = {m["pkg"] for m in found}
    unknown = packages - {None, *ARCHIVES}
    assert not unknown, f"citations of packages this test cannot fetch: {sorted(unknown)}"
    # a citation form the pattern stopped matching would otherwise pass as "nothing to check"
    assert packages == {None, *ARCHIVES} and len(found) >= 80, (len(found), packages)


def test_every_citation_is_on_the_line_it_names(source):
    wrong = []
    for m in citations():
        where = f"{m['pkg']}-{m['ver']}/{m['path']}" if m["pkg"] else m["path"]
        lines = source(m["pkg"], m["ver"], m["path"])
        number, text = int(m["line"]), m["text"]
        if lines is None:
            wrong.append(f"{where}: no such file")
        elif not 1 <= number <= len(lines):
            wrong.append(f"{where}:{number}: the file has {len(lines)} lines")
        elif text not in lines[number - 1]:
            wrong.append(f"{where}:{number}: {text!r} is not on it; it reads {lines[number - 1].strip()!r}")
    assert not wrong, "docs/deepseek-0.9.1.md cites lines that do not hold:\n" + "\n".join(wrong)


def _patch_id(path: str) -> str:
    return re.match(r"(shared|ds)-\d{4}", Path(path).name).group(0)


def test_every_patch_of_the_0_7_1_series_has_a_fate():
    bases = tomllib.loads(MANIFEST.read_text(encoding="utf-8"))["bases"]
    series_071 = [_patch_id(p) for p in bases["0.7.1"]["series"]]
    # the 0.6.0 patches 0.7.1 neither carries nor ports as ds-01NN (its retired ones, the shared ones it dropped)
    dropped = [
        pid
        for pid in map(_patch_id, bases["0.6.0"]["series"])
        if pid not in series_071
        and not (pid.startswith("ds-00") and pid.replace("ds-00", "ds-01") in series_071)
    ]
    assert set(bases["0.7.1"]["retired"]) <= set(dropped)
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    missing = []
    for pid in series_071 + dropped:
        fates = [row for row in rows if f"`{pid}`" in row.split("|")[1]]
        if len(fates) != 1 or not re.search(r"\*\*(carry|retire)\b", fates[0]):
            missing.append(f"{pid}: {len(fates)} rows")
    assert not missing, f"patches without exactly one row saying carry or retire: {missing}"
