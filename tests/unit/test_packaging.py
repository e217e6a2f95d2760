"""The packaging in pyproject.toml matches the tree: pkg/agora/ maps each top-level folder into
the ``agora`` namespace, every package is listed for wheels, each folder says it is typed, and the
installed ``agora`` is these files (so mypy, editors and the interpreter all read them)."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

import agora.sdk

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("sdk", "master", "agent", "frameworks")

#: sha256 of the Apache License 2.0 text as apache.org serves it (LICENSE-2.0.txt).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_pkg_agora_links_each_folder() -> None:
    links = sorted((ROOT / "pkg" / "agora").iterdir())
    assert [p.name for p in links] == sorted(FOLDERS)
    for link in links:
        assert link.is_symlink(), link
        assert link.resolve() == ROOT / link.name
    assert not (ROOT / "pkg" / "agora" / "__init__.py").exists()  # a namespace package
    assert _pyproject()["tool"]["setuptools"]["package-dir"] == {"": "pkg"}


def test_every_package_folder_is_listed_for_wheels() -> None:
    found = {"agora"} | {
        "agora." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    assert found == listed, {"not listed": found - listed, "not a package": listed - found}


def test_each_folder_is_marked_typed() -> None:
    for folder in FOLDERS:
        assert (ROOT / folder / "py.typed").is_file(), folder
    assert _pyproject()["tool"]["setuptools"]["package-data"] == {"*": ["py.typed"]}


def test_the_installed_agora_is_this_tree() -> None:
    assert Path(agora.sdk.__file__).resolve() == ROOT / "sdk" / "__init__.py"


def test_license_is_apache_2_0_as_spdx_and_in_full() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256
