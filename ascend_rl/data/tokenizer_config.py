"""Install the Qwen2.5 recipe's tokenizer_config.json into a downloaded model folder, or take it back out.

The model's own file is kept as tokenizer_config.json.orig (made once, never overwritten), so --restore
always returns the downloaded original. A chat_template.jinja in the folder would take precedence over the
template in tokenizer_config.json (transformers reads that file first), so it is set aside the same way.
Running the install twice changes nothing the second time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ascend_rl.data.util import DataError
from ascend_rl.paths import RECIPES

DEFAULT_CONFIG = RECIPES / "qwen2_5" / "tokenizer_config.json"
TARGET = "tokenizer_config.json"
JINJA = "chat_template.jinja"
BACKUP_SUFFIX = ".orig"
MODEL_TYPES = ("qwen2",)


def _backup(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def _atomic_copy(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_model_dir(model_dir: Path, force: bool = False) -> None:
    """Refuse a folder that is not a downloaded Qwen2 model (unless force)."""
    if not (model_dir / "config.json").is_file():
        raise DataError(f"{model_dir} has no config.json; pass the folder the model was downloaded to")
    try:
        model_type = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise DataError(
            f"{model_dir / 'config.json'} is not a JSON object ({exc}); download the model again"
        ) from exc
    if model_type not in MODEL_TYPES and not force:
        raise DataError(
            f"{model_dir} holds a {model_type!r} model, not qwen2; this tokenizer config is for Qwen2.5 "
            "(pass --force to install it anyway)"
        )


def _check_config(config: Path) -> bytes:
    try:
        data = config.read_bytes()
        parsed = json.loads(data)
    except OSError as exc:
        raise DataError(f"cannot read {config} ({exc.strerror}); run from a complete checkout") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{config} is not valid JSON ({exc}); restore it from git") from exc
    if not isinstance(parsed, dict) or "chat_template" not in parsed:
        raise DataError(f"{config} has no chat_template; restore it from git")
    return data


def install(
    model_dir: str | Path,
    config: str | Path = DEFAULT_CONFIG,
    *,
    dry_run: bool = False,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Install config as model_dir/tokenizer_config.json; return what was (or would be) done."""
    model_dir, config = Path(model_dir), Path(config)
    check_model_dir(model_dir, force)
    ours = _check_config(config)
    target, jinja = model_dir / TARGET, model_dir / JINJA
    if jinja.exists() and _backup(jinja).exists():
        raise DataError(
            f"both {jinja} and {_backup(jinja)} exist; remove the one you do not want, then rerun"
        )

    actions: list[str] = []
    if target.exists() and target.read_bytes() == ours:
        pass
    else:
        if target.exists() and not _backup(target).exists():
            actions.append(f"back up {target} to {_backup(target)}")
        elif not target.exists():
            actions.append(f"note: {target} did not exist, so there is no original to back up")
        actions.append(f"install {config} as {target}")
    if jinja.exists():
        actions.append(f"move {jinja} to {_backup(jinja)} (it would override the installed chat template)")
    if not actions:
        actions.append(f"already installed in {model_dir}; nothing to do")

    for line in actions:
        log(f"dry run: would {line}" if dry_run and not line.startswith(("note", "already")) else line)
    if dry_run:
        return actions

    if not (target.exists() and target.read_bytes() == ours):
        if target.exists() and not _backup(target).exists():
            _atomic_copy(target, _backup(target))
        _atomic_copy(config, target)
    if jinja.exists():
        os.replace(jinja, _backup(jinja))
    return actions


def restore(model_dir: str | Path, *, dry_run: bool = False, log: Callable[[str], None] = print) -> list[str]:
    """Put the backed-up originals back; return what was (or would be) done."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise DataError(f"{model_dir} is not a directory; pass the model folder")
    pairs = [(_backup(model_dir / name), model_dir / name) for name in (TARGET, JINJA)]
    pairs = [(b, t) for b, t in pairs if b.exists()]
    if not pairs:
        raise DataError(f"no {TARGET}{BACKUP_SUFFIX} in {model_dir}; nothing to restore")
    actions = [f"restore {t} from {b}" for b, t in pairs]
    for line in actions:
        log(f"dry run: would {line}" if dry_run else line)
    if not dry_run:
        for b, t in pairs:
            os.replace(b, t)
    return actions
