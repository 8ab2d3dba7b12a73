"""The release bookkeeping users pin against: the version, the changelog and the licence agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def _releases() -> list[tuple[str, str]]:
    return RELEASE.findall((REPO / "CHANGELOG.md").read_text(encoding="utf-8"))


def test_version_is_the_newest_changelog_release():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    releases = _releases()
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    assert releases[0][0] == version, (
        f"pyproject.toml says {version}, CHANGELOG.md's newest is {releases[0][0]}"
    )


def test_changelog_releases_are_newest_first_and_unique():
    releases = _releases()
    versions = [tuple(map(int, v.split("."))) for v, _ in releases]
    assert versions == sorted(set(versions), reverse=True)
    dates = [d for _, d in releases]
    assert dates == sorted(dates, reverse=True)
    assert "## [Unreleased]" in (REPO / "CHANGELOG.md").read_text(encoding="utf-8")


def test_licence_is_apache_2_and_declared():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
