"""Finding effects: ``agents/effects/*.py`` by file name, package effects by entry point.

Rules (docs/design.md, "Defining" and "Package effects"):
- Each ``*.py`` file directly inside ``<app_dir>/effects/`` defines exactly one effect, whose
  name is the file name without ``.py``; names are snake_case (``^[a-z][a-z0-9_]*$``).
- Files starting with ``_`` (``__init__.py``, private helpers) are not effects. Effect files
  import their helpers relatively (``from ._common import x``): see `app_package`.
- A bad name, an import error, no definition or several definitions stop startup with an
  `EffectDefinitionError` naming the file.
- An installed distribution publishes effects with an entry point in the group
  ``thread_effects.packages``: its name is the ``packageId`` (``^[a-z][a-z0-9_-]*$``), its
  value an importable package whose ``effects/`` folder follows the rules above. Its effects
  are scheduled as ``"{packageId}/{effect}"``; code inside the package may use short names.
- A package's bad effect file stops startup naming the package, its distribution and the
  file; so do a bad ``packageId``, an entry point that cannot be imported, and one
  ``packageId`` claimed by two distributions.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.resources
import importlib.util
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from runtime._limits import quoted
from runtime._text import NUL, no_nul_message
from runtime.effects import EFFECT_NAME_RE, EffectDefinition
from runtime.errors import EffectDefinitionError, EffectNotFound, InvalidArgument

D = TypeVar("D")
E = TypeVar("E", bound=Exception)

PACKAGES_GROUP = "thread_effects.packages"
"""The entry point group through which installed distributions publish effects."""

PACKAGE_ID_RE = re.compile(r"^[a-z][a-z0-9_-]*\Z")
"""A ``packageId`` (an entry point name): lowercase letters, digits, ``_`` and ``-``."""


APP_MODULE_PREFIX = "_thread_effects_app_"
"""App files are imported as ``_thread_effects_app_<hash of the folder>.<folder>.<file>``."""


def module_segment(name: str) -> str:
    """A file or folder name as one segment of a module name (``[id]`` → ``_id_``)."""
    return re.sub(r"\W", "_", name)


def _ensure_package(name: str, folder: Path) -> ModuleType:
    existing = sys.modules.get(name)
    if existing is not None and list(getattr(existing, "__path__", ())) == [str(folder)]:
        return existing
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    module = importlib.util.module_from_spec(spec)
    module.__doc__ = f"The application folder {folder} (made by thread-effects, no __init__)."
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


def app_package(app_dir: Path, *folders: str) -> str:
    """Register an app folder (and subfolders) as packages in ``sys.modules``; return the name.

    An application folder is not an importable package (it needs no ``__init__.py`` and
    is not on ``sys.path``), so its files are loaded under a synthetic name, unique per
    folder (two runtimes of one process never share modules). Every level of that name
    is a real package whose ``__path__`` is its folder, so a file's relative imports of
    its helper files work: ``from ._common import x`` in ``effects/remind.py`` imports
    ``effects/_common.py``, ``from .._shared import y`` reaches the app folder's own.

    Args:
        app_dir: The application folder.
        *folders: Subfolders beneath it, outermost first (``"api", "notes"``).

    Returns:
        The dotted package name of the innermost folder.
    """
    root = Path(app_dir).resolve()
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    name = f"{APP_MODULE_PREFIX}{digest}"
    _ensure_package(name, root)
    folder = root
    for part in folders:
        folder = folder / part
        name = f"{name}.{module_segment(part)}"
        _ensure_package(name, folder)
    return name


def _import_failed(path: str, exc: BaseException, error: type[E]) -> E:
    """The error for a file whose import raised ``exc``, with the file's line."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    where = f" (line {lines[-1]})" if lines else ""
    return error(f"{path}: import failed{where}: {type(exc).__name__}: {exc}")


def load_module_file(path: Path, module_name: str, error: type[Exception]) -> ModuleType:
    """Import one application file under ``module_name``.

    Raises:
        error: naming the file and the line, if the import raises (``sys.exit()``
            included); the half-made module is removed from ``sys.modules``.
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py paths
        raise error(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # sys.exit() at import is a broken file too
        sys.modules.pop(module_name, None)
        raise _import_failed(str(path), exc, error) from exc
    return module


def single_definition(
    module: ModuleType,
    kind: type[D],
    path: object,
    what: str,
    error: type[Exception],
    hint: str = "",
) -> D:
    """The one ``kind`` object a loaded file holds at module level.

    Args:
        module: The loaded file.
        kind: The definition class (`EffectDefinition`, `ToolDefinition`, ...).
        path: The file, for messages.
        what: The thing's name in messages ("effect", "tool", ...).
        error: The exception class to raise.
        hint: Appended to the "defines no ..." message.

    Raises:
        error: when the file defines none, or several (the same object under two names
            counts once).
    """
    found: list[D] = []
    for value in vars(module).values():
        if isinstance(value, kind) and not any(value is f for f in found):
            found.append(value)
    if not found:
        raise error(
            f"{path}: defines no {what}; assign define_{what.replace(' ', '_')}(...) to a "
            f"module-level name{hint}"
        )
    if len(found) > 1:
        raise error(f"{path}: defines {len(found)} {what}s; one file holds exactly one {what}"
                    + (" (its name is the file name)" if what == "effect" else ""))
    return found[0]


def _the_definition(module: ModuleType, path: str) -> EffectDefinition:
    """The one `EffectDefinition` a loaded effect file holds."""
    return single_definition(
        module, EffectDefinition, path, "effect", EffectDefinitionError,
        ", e.g. `effect = define_effect(...)`",
    )


def _load_files(
    files: Iterable[tuple[str, str]],
    load: Callable[[str, str], ModuleType],
    package_id: str | None,
) -> dict[str, EffectDefinition]:
    """Load effect files given as (file name, path for messages), in file name order."""
    effects: dict[str, EffectDefinition] = {}
    for filename, path in sorted(files):
        stem = filename.removesuffix(".py")
        if stem.startswith("_"):
            continue
        if not EFFECT_NAME_RE.match(stem):
            raise EffectDefinitionError(
                f"{path}: effect file names must be snake_case "
                f"(^[a-z][a-z0-9_]*$), so {filename!r} is not a valid effect name"
            )
        module = load(stem, path)
        effects[stem] = replace(_the_definition(module, path), name=stem, package_id=package_id)
    return effects


def load_effects_dir(
    effects_dir: Path, *, package_id: str | None = None, module_prefix: str = "agents.effects"
) -> dict[str, EffectDefinition]:
    """Load every effect file in one folder.

    Each file is executed afresh under ``{module_prefix}.{name}``, so a folder that is
    not a Python package (like ``agents/effects``) can be loaded by several runtimes.

    Args:
        effects_dir: The folder (``<app_dir>/effects``). A missing folder means no effects.
        package_id: Set on each definition for package effects; None for the app's own.
        module_prefix: The ``sys.modules`` prefix the files are imported under.

    Returns:
        Effect name → definition (with ``name`` and ``package_id`` filled in).

    Raises:
        EffectDefinitionError: naming the file, for a bad name, an import error, or a
            file with no or several `EffectDefinition` objects.
    """
    if not effects_dir.is_dir():
        return {}
    try:
        return _load_files(
            ((p.name, str(p)) for p in effects_dir.glob("*.py")),
            lambda stem, path: load_module_file(
                Path(path), f"{module_prefix}.{stem}", EffectDefinitionError
            ),
            package_id,
        )
    except EffectDefinitionError as exc:
        if package_id is None:
            raise
        raise EffectDefinitionError(f"package {package_id!r}: {exc}") from exc


@dataclass
class EffectRegistry:
    """Every effect the runtime knows: the app's own and those of installed packages.

    Attributes:
        app: The app's effects by name.
        packages: ``package_id`` → that package's effects by short name.
        packages_loaded: False when the runtime was started with ``load_packages=False``
            (then an unknown package says so, rather than "not installed").
    """

    app: dict[str, EffectDefinition] = field(default_factory=dict)
    packages: dict[str, dict[str, EffectDefinition]] = field(default_factory=dict)
    packages_loaded: bool = True

    def _no_package(self, package_id: str) -> str:
        if not self.packages_loaded:
            return (
                f"package {quoted(package_id)} cannot be used: packages are not loaded "
                f"(load_packages=False)"
            )
        return f"no package {quoted(package_id)} is installed"

    def resolve(self, name: str, *, package_id: str | None = None) -> EffectDefinition:
        """Find an effect by the name a caller used.

        A qualified name means the same effect from anywhere. A short name means the
        caller's own: the app's effect for app code, and for code inside a package that
        package's effect only (a package cannot know which app it is installed in, so a
        short name never silently reaches an app effect that happens to share it).

        Args:
            name: ``"effect"`` or ``"{package_id}/{effect}"``.
            package_id: The package the caller's code belongs to, if any.

        Returns:
            The definition (its ``qualified_name`` is what runs are stored under).

        Raises:
            EffectNotFound: naming what was asked for, and which package lacks it.
            InvalidArgument: the name holds NUL (no name may: docs/http-api.md).
        """
        if NUL in name:
            raise InvalidArgument(no_nul_message("name"))
        if "/" in name:
            pkg, _, short = name.partition("/")
            effects = self.packages.get(pkg)
            if effects is None:
                raise EffectNotFound(name, self._no_package(pkg))
            if short not in effects:
                raise EffectNotFound(name, f"package {quoted(pkg)} has no effect {quoted(short)}")
            return effects[short]
        if package_id is not None:
            own = self.packages.get(package_id)
            if own is None:
                why = (
                    "which is not installed" if self.packages_loaded
                    else "but packages are not loaded (load_packages=False)"
                )
                raise EffectNotFound(
                    name, f"the caller belongs to package {quoted(package_id)}, {why}"
                )
            if name not in own:
                raise EffectNotFound(
                    name,
                    f"package {quoted(package_id)} has no effect {quoted(name)}; inside a "
                    f"package a short name means the package's own effect",
                )
            return own[name]
        if name in self.app:
            return self.app[name]
        raise EffectNotFound(name)

    def all(self) -> Iterable[EffectDefinition]:
        """Every definition, app effects first, then packages in id order."""
        yield from self.app.values()
        for pkg in sorted(self.packages):
            yield from self.packages[pkg].values()


def discover(app_dir: Path | None) -> EffectRegistry:
    """Build the registry for an app folder (its ``effects/`` subfolder).

    Raises:
        EffectDefinitionError: see `load_effects_dir`.
    """
    registry = EffectRegistry()
    if app_dir is not None:
        root = Path(app_dir).resolve()
        if (root / "effects").is_dir():
            # A package per app folder keeps two runtimes of one process (tests) from
            # overwriting each other's modules, and lets effect files import helpers.
            registry.app = load_effects_dir(
                root / "effects", module_prefix=app_package(root, "effects")
            )
    return registry


def _describe(ep: importlib.metadata.EntryPoint) -> str:
    """``distribution version (at site folder)`` for messages."""
    dist = ep.dist
    if dist is None:  # an EntryPoint built by hand rather than read from metadata
        return "an unknown distribution"
    return f"{dist.name} {dist.version} (in {dist.locate_file('')})"


def load_package_effects(
    package_id: str, entry_point: importlib.metadata.EntryPoint
) -> dict[str, EffectDefinition]:
    """Load one package's effects from the ``effects/`` folder of its entry point's module.

    Each file is imported as ``{module}.effects.{name}`` through the normal import system,
    so relative imports inside the package work and the package's other code shares the
    same module objects.

    Args:
        package_id: The entry point's name (already checked against `PACKAGE_ID_RE`).
        entry_point: An entry point of the group `PACKAGES_GROUP`; its value names a
            package (``"my_pkg"``). A package without an ``effects/`` folder has no effects.

    Returns:
        Short effect name → definition, ``package_id`` filled in.

    Raises:
        EffectDefinitionError: naming the package, its distribution and, for a bad effect
            file, the file: the value names an object (``module:attr``) or a plain module
            rather than a package, the package cannot be imported, or a file breaks the
            rules of `load_effects_dir`.
    """
    owner = f"package {package_id!r} (distribution {_describe(entry_point)})"
    if entry_point.attr:
        raise EffectDefinitionError(
            f"{owner}: the entry point value {entry_point.value!r} must name a package, "
            f"such as {entry_point.module!r}, not an object inside one"
        )
    try:
        module = importlib.import_module(entry_point.module)
    except (Exception, SystemExit) as exc:
        raise EffectDefinitionError(
            f"{owner}: cannot import {entry_point.module!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, "__path__"):
        raise EffectDefinitionError(
            f"{owner}: {entry_point.module!r} is a module, not a package; a package's "
            f"effects live in the effects/ folder of the package named by the entry point"
        )
    folder = importlib.resources.files(module).joinpath("effects")
    if not folder.is_dir():
        return {}
    files = [
        (entry.name, str(entry))
        for entry in folder.iterdir()
        if entry.name.endswith(".py") and entry.is_file()
    ]

    def load(name: str, path: str) -> ModuleType:
        try:
            return importlib.import_module(name)
        except (Exception, SystemExit) as exc:
            raise _import_failed(path, exc, EffectDefinitionError) from exc

    try:
        # The folder's own __init__.py first, so its failure is not blamed on an effect.
        load(f"{module.__name__}.effects", str(folder.joinpath("__init__.py")))
        return _load_files(
            files, lambda stem, path: load(f"{module.__name__}.effects.{stem}", path), package_id
        )
    except EffectDefinitionError as exc:
        raise EffectDefinitionError(f"{owner}: {exc}") from exc


def discover_packages() -> dict[str, dict[str, EffectDefinition]]:
    """Effects of installed packages (entry point group ``thread_effects.packages``).

    Every ``packageId`` is checked before any package is imported, so a clash or a bad
    id is reported even when a package's code is broken too. Packages load in id order.

    Returns:
        ``package_id`` → effects by short name.

    Raises:
        EffectDefinitionError: one ``packageId`` claimed by two distributions (naming
            both), an id that does not match ``^[a-z][a-z0-9_-]*$`` (naming the
            distribution), or a package that fails `load_package_effects`.
    """
    claims: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=PACKAGES_GROUP):
        claims.setdefault(ep.name, []).append(ep)
    for package_id, eps in sorted(claims.items()):
        if len(eps) > 1:
            who = "; ".join(f"{_describe(ep)} as {ep.value!r}" for ep in eps)
            raise EffectDefinitionError(
                f"packageId {package_id!r} is claimed by {len(eps)} distributions: {who}. "
                f"A packageId names one package: uninstall one of them"
            )
        if not PACKAGE_ID_RE.match(package_id):
            raise EffectDefinitionError(
                f"packageId {package_id!r} of distribution {_describe(eps[0])} is not valid: "
                f"entry point names in the group {PACKAGES_GROUP!r} must match "
                f"^[a-z][a-z0-9_-]*$ (lowercase letters, digits, '_' and '-')"
            )
    return {
        package_id: load_package_effects(package_id, eps[0])
        for package_id, eps in sorted(claims.items())
    }
