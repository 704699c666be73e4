"""Finding effects: ``agents/effects/*.py`` by file name, package effects by entry point.

Rules (DESIGN.md, "Defining"):
- Each ``*.py`` file directly inside ``<app_dir>/effects/`` defines exactly one effect, whose
  name is the file name without ``.py``; names are snake_case (``^[a-z][a-z0-9_]*$``).
- Files starting with ``_`` (``__init__.py``, private helpers) are not effects.
- A bad name, an import error, no definition or several definitions stop startup with an
  `EffectDefinitionError` naming the file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from runtime.effects import EFFECT_NAME_RE, EffectDefinition
from runtime.errors import EffectDefinitionError, EffectNotFound


def _load_module(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py paths
        raise EffectDefinitionError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" (line {last.lineno})" if last and last.filename == str(path) else ""
        raise EffectDefinitionError(
            f"{path}: import failed{where}: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def load_effects_dir(
    effects_dir: Path, *, package_id: str | None = None, module_prefix: str = "agents.effects"
) -> dict[str, EffectDefinition]:
    """Load every effect file in one folder.

    Args:
        effects_dir: The folder (``<app_dir>/effects`` or a package's ``effects/``). A
            missing folder means no effects.
        package_id: Set on each definition for package effects; None for the app's own.
        module_prefix: The ``sys.modules`` prefix the files are imported under.

    Returns:
        Effect name → definition (with ``name`` and ``package_id`` filled in).

    Raises:
        EffectDefinitionError: naming the file, for a bad name, an import error, or a
            file with no or several `EffectDefinition` objects.
    """
    effects: dict[str, EffectDefinition] = {}
    if not effects_dir.is_dir():
        return effects
    owner = f"package {package_id!r}: " if package_id else ""
    for path in sorted(effects_dir.glob("*.py")):
        stem = path.stem
        if stem.startswith("_"):
            continue
        if not EFFECT_NAME_RE.match(stem):
            raise EffectDefinitionError(
                f"{owner}{path}: effect file names must be snake_case "
                f"(^[a-z][a-z0-9_]*$), so {path.name!r} is not a valid effect name"
            )
        module = _load_module(path, f"{module_prefix}.{stem}")
        found: list[EffectDefinition] = []
        for value in vars(module).values():
            if isinstance(value, EffectDefinition) and not any(value is f for f in found):
                found.append(value)
        if not found:
            raise EffectDefinitionError(
                f"{owner}{path}: defines no effect; assign define_effect(...) to a "
                f"module-level name, e.g. `effect = define_effect(...)`"
            )
        if len(found) > 1:
            raise EffectDefinitionError(
                f"{owner}{path}: defines {len(found)} effects; one file holds exactly one "
                f"effect (its name is the file name)"
            )
        effects[stem] = replace(found[0], name=stem, package_id=package_id)
    return effects


@dataclass
class EffectRegistry:
    """Every effect the runtime knows: the app's own and those of installed packages.

    Attributes:
        app: The app's effects by name.
        packages: ``package_id`` → that package's effects by short name.
    """

    app: dict[str, EffectDefinition] = field(default_factory=dict)
    packages: dict[str, dict[str, EffectDefinition]] = field(default_factory=dict)

    def resolve(self, name: str, *, package_id: str | None = None) -> EffectDefinition:
        """Find an effect by the name a caller used.

        Args:
            name: ``"effect"`` or ``"{package_id}/{effect}"``.
            package_id: The package the caller's code belongs to, if any: inside a package
                a short name means that package's own effect.

        Returns:
            The definition (its ``qualified_name`` is what runs are stored under).

        Raises:
            EffectNotFound: naming what was asked for.
        """
        if "/" in name:
            pkg, _, short = name.partition("/")
            effects = self.packages.get(pkg)
            if effects is None:
                raise EffectNotFound(name, f"no package {pkg!r} is installed")
            if short not in effects:
                raise EffectNotFound(name, f"package {pkg!r} has no effect {short!r}")
            return effects[short]
        if package_id is not None:
            own = self.packages.get(package_id, {})
            if name in own:
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
        # A prefix per app folder keeps two runtimes of one process (tests) from
        # overwriting each other's modules in sys.modules.
        digest = hashlib.sha1(str(root).encode()).hexdigest()[:10]
        registry.app = load_effects_dir(
            root / "effects", module_prefix=f"_thread_effects_app_{digest}.effects"
        )
    return registry


def discover_packages() -> dict[str, dict[str, EffectDefinition]]:
    """Effects of installed packages (entry point group ``thread_effects.packages``).

    Returns:
        ``package_id`` → effects by short name. Empty until package support lands.
    """
    return {}
