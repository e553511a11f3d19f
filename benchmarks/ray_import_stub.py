"""A stand-in for Ray's import surface, for benchmarks/verl_actor_gpu.py on a GPU machine without Ray.

verl imports Ray at module level (`verl/protocol.py`, its worker decorators), but the one-process path that
script runs (verl's `ActorRolloutRefWorker` called directly) makes no Ray call. Importing this module
installs a finder that answers `import ray` and `import ray.<anything>` with modules whose attributes are
inert: decorators return what they decorate, calls return another inert object. It is not Ray, and nothing
in asyncrl's product or tests uses it; the product's Ray paths run against real Ray in the tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Inert:
    def __init__(self, name: str = "ray") -> None:
        self._name = name

    def __getattr__(self, key: str) -> _Inert:
        if key.startswith("__"):
            raise AttributeError(key)
        return _Inert(f"{self._name}.{key}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator
        return _Inert(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __or__(self, other: Any) -> Any:
        return object

    __ror__ = __or__

    def __getitem__(self, key: Any) -> Any:
        return object


class _InertModule(types.ModuleType):
    def __getattr__(self, key: str) -> _Inert:
        if key.startswith("__"):
            raise AttributeError(key)
        return _Inert(f"{self.__name__}.{key}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "ray" or name.startswith("ray."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if "ray" not in sys.modules:
    sys.meta_path.insert(0, _Finder())
