"""The DeepSeek recipe's verl 0.9.1 base, form only (issue 46, step 1 of docs/deepseek-0.9.1.md's plan).

Every patch of the 0.7.1 series, and each 0.6.0 one the 0.7.1 base neither carries nor ports, is on 0.9.1 exactly one
of: in the series (itself, or a 0.9.1 port whose header says "The 0.9.1 port of <id>"), retired (recipe.toml's
`retired` table, each row citing lines the porting map re-reads in the artifacts), or pending (recipe.toml's `pending`
table, each row naming the step of issue 46 that ports it); and that fate agrees with the map's. Then the overlay
command as a user types it on the real 0.9.1 sdist: status lists the series and what is pending, apply / revert
come back byte-exact, and a 0.9.1 tree given to the 0.7.1 series is told patch by patch with this base's evidence.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from test_deepseek_091_map import DOC, citations

from ascend_rl import manifest, patchdoc, patchset
from ascend_rl.paths import REPO

BASE = "0.9.1"
ID = re.compile(r"(?:shared|ds)-\d{4}")
PORT_OF = re.compile(r"The 0\.9\.1 port of ((?:shared|ds)-\d{4})")


def cli(capsys, *args) -> tuple[int, str, str]:
    """`python3 -m ascend_rl overlay ARGS` in this process: (exit status, stdout, stderr)."""
    from ascend_rl.cli import overlay as overlay_cli

    capsys.readouterr()
    code = overlay_cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def earlier_patches() -> list[str]:
    """What the 0.9.1 base must account for: the 0.7.1 series, then each 0.6.0 patch 0.7.1 neither carries nor ports
    as ds-01NN (its retired ones and the shared ones it dropped), as the map's own fate test reads them."""
    bases = tomllib.loads((REPO / "llm_rl" / "deepseek_r1" / "recipe.toml").read_text(encoding="utf-8"))[
        "bases"
    ]
    series_071 = [patchset.patch_id(Path(p)) for p in bases["0.7.1"]["series"]]
    dropped = [
        pid
        for pid in (patchset.patch_id(Path(p)) for p in bases["0.6.0"]["series"])
        if pid not in series_071
        and not (pid.startswith("ds-00") and pid.replace("ds-00", "ds-01") in series_071)
    ]
    return series_071 + dropped


def map_fates() -> dict[str, tuple[str, list[str]]]:
    """patch id -> (carry or retire, the patch ids its row says it is carried as), from the map's section 1 rows."""
    fates = {}
    for row in DOC.read_text(encoding="utf-8").splitlines():
        if not row.startswith("| `"):
            continue
        cells = row.split("|")
        fate = re.search(r"\*\*(carry|retire)\b[^*]*\*\*( as [^|(]*)?", cells[3])
        if fate is None:
            continue
        carried_as = ID.findall(fate.group(2) or "")
        for pid in ID.findall(cells[1]):
            fates[pid] = (fate.group(1), carried_as)
    return fates


def fates_on(recipe: manifest.Recipe) -> dict[str, list[str]]:
    """patch id -> where the base puts it: "series" (the patch or a port of it in the series), "retired", "pending"."""
    where: dict[str, list[str]] = {}
    for path in recipe.series:
        where.setdefault(patchset.patch_id(path), []).append("series")
        description = " ".join(patchdoc.read_header(path).long_description)
        for ported in PORT_OF.findall(description):
            where.setdefault(ported, []).append("series")
    for pid in recipe.retired:
        where.setdefault(pid, []).append("retired")
    for pid in recipe.pending:
        where.setdefault(pid, []).append("pending")
    return where


def unaccounted(
    recipe: manifest.Recipe, earlier: list[str], fates: dict[str, tuple[str, list[str]]]
) -> list[str]:
    """Each earlier patch the base does not account for exactly once, or for otherwise than the map says."""
    where = fates_on(recipe)
    series = {patchset.patch_id(p) for p in recipe.series}
    problems = []
    for pid in earlier:
        places = where.get(pid, [])
        fate, carried_as = fates.get(pid, ("", []))
        if pid not in where and fate == "carry" and carried_as and set(carried_as) <= series:
            places = ["series"]  # the map's "carry as shared-0016, shared-0017" (0.6.0's shared-0100/0101)
        if len(places) != 1:
            problems.append(f"{pid}: {' and '.join(places) or 'neither in the series, retired nor pending'}")
        elif fate == "retire" and places[0] == "series":
            problems.append(f"{pid}: in the series, the map retires it")
        elif fate == "carry" and places[0] == "retired":
            problems.append(f"{pid}: retired, the map carries it")
        elif not fate:
            problems.append(f"{pid}: no row of the map gives its fate")
    return problems


@pytest.fixture(scope="module")
def recipe() -> manifest.Recipe:
    return manifest.load_recipe("deepseek_r1", BASE)


def test_the_base_is_qwens_pin_on_the_a3_image_and_the_default(recipe):
    qwen = manifest.load_recipe("qwen2_5", BASE)
    assert (recipe.tag, recipe.sdist, recipe.sdist_sha256) == (qwen.tag, qwen.sdist, qwen.sdist_sha256)
    assert recipe.constraints == qwen.constraints == "constraints-0.9.1.txt"
    assert recipe.image == qwen.image.replace("-910b-", "-a3-") and "Dockerfile.a3:18" in recipe.image_source
    assert "trainer.use_v1=False" in recipe.overrides
    assert recipe.default == BASE  # the recipe's default base since issue 46's CPU runs passed
    # the carried shared ports, in Qwen's order, then the recipe's own: ds-0103 serves 0.7.1 and 0.9.1 from one file,
    # ds-0206 is ds-0106's port (the reshard inside the bridge's export), ds-0204 / ds-0208 ds-0104's / ds-0108's,
    # ds-0211 ds-0111's (the checkpoint writers)
    ids = [patchset.patch_id(p) for p in recipe.series]
    expected = [
        *(patchset.patch_id(p) for p in qwen.series),
        "ds-0103",
        "ds-0206",
        "ds-0204",
        "ds-0208",
        "ds-0211",
    ]
    assert ids == expected
    assert all(BASE in patchdoc.header_bases(patchdoc.read_header(p)) for p in recipe.series[-5:])


def test_the_image_is_the_one_vllm_ascends_a3_dockerfile_builds_on(recipe):
    """recipe.toml's image is line 18 of vllm-ascend 0.23.0.post1's Dockerfile.a3 (FROM), its vLLM tag line 44."""
    import tarfile

    from ascend_rl import artifacts
    from ci_policy import get_artifact

    version = artifacts.pinned("vllm-ascend", REPO / recipe.constraints)
    sdist = get_artifact(f"vllm-ascend {version} sdist", artifacts.vllm_ascend_sdist, version)
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        lines = tar.extractfile(f"{top}/Dockerfile.a3").read().decode().splitlines()
    assert lines[17] == f"FROM {recipe.image}" and lines[43] == "ARG VLLM_TAG=v0.23.0"
    assert artifacts.pinned("vllm", REPO / recipe.constraints) == "0.23.0"


def test_every_earlier_patch_is_carried_retired_or_pending_as_the_map_says(recipe):
    earlier = earlier_patches()
    assert len(earlier) >= 24, earlier  # 17 of the 0.7.1 series, 0.6.0's dropped ones
    assert unaccounted(recipe, earlier, map_fates()) == []
    # nothing in the tables that no earlier base had
    assert set(recipe.retired) | set(recipe.pending) <= set(earlier)


def test_a_patch_left_out_or_put_twice_is_found(recipe):
    """Negative controls of the accounting: one retired row dropped, a retired patch also pending, a ported patch
    also retired, a carried patch retired against the map."""
    from dataclasses import replace

    earlier, fates = earlier_patches(), map_fates()
    dropped = replace(recipe, retired={k: v for k, v in recipe.retired.items() if k != "ds-0112"})
    assert unaccounted(dropped, earlier, fates) == ["ds-0112: neither in the series, retired nor pending"]
    # no port is pending any more (steps 3-5 landed): a retired patch put in the table as well
    twice = replace(recipe, pending={"ds-0112": "x"})
    assert unaccounted(twice, earlier, fates) == ["ds-0112: retired and pending"]
    ported = replace(recipe, retired={**recipe.retired, "ds-0104": "x"})  # ds-0204 is its port in the series
    assert unaccounted(ported, earlier, fates) == ["ds-0104: series and retired"]
    against = replace(  # ds-0111's port taken out of the series and ds-0111 retired instead
        recipe,
        series=tuple(p for p in recipe.series if patchset.patch_id(p) != "ds-0211"),
        retired={**recipe.retired, "ds-0111": "x"},
    )
    assert unaccounted(against, earlier, fates) == ["ds-0111: retired, the map carries it"]


def test_each_pending_port_names_the_step_that_brings_it(recipe):
    # the ports of steps 3-5; each left this table when its patch joined the series (the accounting above finds it
    # in both otherwise) or, ds-0109, retired: none is left. A port added later must name its step, as they did.
    assert recipe.pending == {}
    text = DOC.read_text(encoding="utf-8")
    plan = text.split("## 4. Work plan", 1)[1]
    rows = {
        ID.search(r.split("|")[1]).group(0): r
        for r in text.splitlines()
        if r.startswith("| `") and ID.search(r)
    }
    for pid, what in recipe.pending.items():
        step = re.match(r"issue 46 step (\d): ", what)
        assert step, f"{pid}: {what!r} does not start with 'issue 46 step N: '"
        item = re.search(rf"^{step.group(1)}\. \*\*.*?(?=^\d\. \*\*|\Z)", plan, re.MULTILINE | re.DOTALL)
        # the plan's step names the patch, or the map's row for it names the step
        assert item and (f"`{pid}`" in item.group(0) or f"step {step.group(1)}" in rows[pid]), (
            f"{pid}: neither step {step.group(1)} of the plan nor its row in section 1 ties it to that step"
        )


def test_every_retired_row_cites_lines_the_map_checks(recipe, pristine_base):
    """A retired row's `FILE:LINE` (`:LINE` repeats the file before it) is one of the map's citations, which
    test_deepseek_091_map re-reads in the artifacts; for verl's own files the line is read here too."""
    checked: dict[
        tuple[str, int], tuple[str, bool]
    ] = {}  # (where, line) -> (its text, whether in verl's sdist)
    for m in citations():
        where = f"{m['pkg']}-{m['ver']}/{m['path']}" if m["pkg"] else m["path"]
        checked[where, int(m["line"])] = (m["text"], m["pkg"] is None)
    tree = pristine_base(BASE)
    wrong = []
    for pid, evidence in recipe.retired.items():
        cited = re.findall(r"([A-Za-z0-9_./-]+\.(?:py|yaml))?:(\d+)(?:-\d+)?", evidence)
        assert cited, f"{pid}: its evidence cites no line"
        last = None
        for path, line in cited:
            last = path or last
            hits = [(w, n) for (w, n) in checked if n == int(line) and w.endswith(last)]
            if len(hits) != 1:
                wrong.append(f"{pid}: {last}:{line} is {len(hits)} of the map's citations")
                continue
            where, (quoted, in_verl) = hits[0][0], checked[hits[0]]
            if in_verl:
                text = (tree / where).read_text(encoding="utf-8").splitlines()[int(line) - 1]
                if quoted not in text:
                    wrong.append(f"{pid}: {where}:{line} reads {text.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_status_lists_the_series_and_what_is_pending_and_apply_revert_are_byte_exact(
    recipe, pristine_base, tmp_path, capsys
):
    tree = tmp_path / "verl-0.9.1"
    shutil.copytree(pristine_base(BASE), tree, symlinks=True)
    pristine = tree_bytes(tree)
    code, out, err = cli(capsys, "status", "deepseek_r1", "--base", BASE, "--target", tree)
    assert code == 0, err
    rows = [ln.split() for ln in out.splitlines()]
    assert [r[1] for r in rows if r and r[0] == "applicable"] == [patchset.patch_id(p) for p in recipe.series]
    assert [r[1] for r in rows if r and r[0] == "pending"] == list(recipe.pending)
    # nothing pending any more (issue 46 steps 3-5): no "not yet ported" block, no refusal announced
    assert recipe.pending == {} and "not yet ported" not in out and "an NPU launch is refused" not in out

    assert cli(capsys, "apply", "deepseek_r1", "--base", BASE, "--target", tree)[0] == 0
    code, out, _ = cli(capsys, "status", "deepseek_r1", "--base", BASE, "--target", tree)
    assert [ln.split()[0] for ln in out.splitlines() if ln.startswith("  applied ")] == ["applied"] * len(
        recipe.series
    )
    assert tree_bytes(tree) != pristine
    assert cli(capsys, "revert", "deepseek_r1", "--base", BASE, "--target", tree)[0] == 0
    assert tree_bytes(tree) == pristine

    code, out, _ = cli(capsys, "list", "deepseek_r1", "--base", BASE)
    assert code == 0 and "ds-0103" in out
    assert all(f"pending     {pid}" in out for pid in recipe.pending)
    # the default base, listed with nothing pending after its patch count
    summary = f"deepseek_r1: verl {BASE} (default), {len(recipe.series)} patches"
    listed = cli(capsys, "list")[1]
    assert summary in listed and f"{summary} (" not in listed


def test_no_base_reports_pending_ports():
    for name in manifest.recipe_names():
        for spec in manifest.recipe_bases(name):
            assert not spec.pending and spec.pending_line() is None, (name, spec.version)


def test_a_0_9_1_tree_given_to_the_0_7_1_series_names_this_bases_evidence(pristine_base, capsys):
    tree = pristine_base(BASE)
    code, _, err = cli(capsys, "status", "deepseek_r1", "--base", "0.7.1", "--target", tree)
    assert code == 1 and "pass --base 0.9.1" in err and "a base of deepseek_r1" in err
    _, out, _ = cli(capsys, "status", "deepseek_r1", "--base", "0.7.1", "--target", tree, "--force")
    rows = {
        ln.split()[1]: ln.split()[0]
        for ln in out.splitlines()
        if ln.split()[1:2] and ID.fullmatch(ln.split()[1])
    }
    # the fixes 0.9.1 took are told as carried, with the line this base's retired table records
    assert rows["shared-0009"] == "carried" and "vllm_async_server.py:321-322" in out
    assert rows["shared-0011"] == "carried" and "ray_trainer.py:531" in out
    assert rows["ds-0113"] == "carried" and "router_replay_utils.py:207" in out
    # ds-0103 serves both bases from one file; the 0.7.1 ports of what 0.9.1 still lacks do not apply there
    assert rows["ds-0103"] == "applicable"
    assert {rows[pid] for pid in ("ds-0104", "ds-0106", "ds-0108", "ds-0111")} == {"conflicting"}
    # ds-0109 has nothing left to patch on 0.9.1 (every engine loads model.path; the random variant writes a checkpoint)
    assert rows["ds-0109"] == "carried" and "transformer_impl.py:510" in out
