"""What the test hooks in this folder share: patching a module right after its own loader has run it (their one JSON
line per event comes from ascend_rl/shm_record/recipes_shm_record.py). Test-only, like the hooks; never in a recipe."""

import importlib.abc
import importlib.util
import sys


class PatchAfterLoad(importlib.abc.MetaPathFinder):
    """On the first import of a target module, load it with its own loader, then call patch(module).

    targets: module name -> patch. on_error(module, exc): a hook that must never break the run records the failure
    of its patch and goes on; None lets the exception propagate (the import fails, the run shows why)."""

    def __init__(self, targets, on_error=None):
        self.targets, self._on_error = targets, on_error

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        sys.meta_path.remove(self)  # find the module's own spec, not ours again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Patching(spec.loader, self.targets[fullname], self._on_error)
        return spec


class _Patching(importlib.abc.Loader):
    def __init__(self, inner, patch, on_error):
        self._inner, self._patch, self._on_error = inner, patch, on_error

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        if self._on_error is None:
            self._patch(module)
            return
        try:
            self._patch(module)
        except Exception as exc:  # noqa: BLE001 (the hook says so in its record; the run goes on)
            self._on_error(module, exc)


def install(targets, on_error=None) -> PatchAfterLoad:
    """Put a PatchAfterLoad for targets first on sys.meta_path."""
    finder = PatchAfterLoad(targets, on_error)
    sys.meta_path.insert(0, finder)
    return finder
