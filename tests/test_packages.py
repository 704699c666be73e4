"""Package effects as a user sees them: a real distribution, installed with pip, publishes
effects through the ``thread_effects.packages`` entry point group.

``tests/fixtures/te_demo_pkg`` is installed into this environment (once, and again when its
files change). The broken distributions are installed into temporary folders that are put
on ``sys.path`` only inside the test that needs them, so other tests' runtimes never see
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from runtime import EffectDefinitionError, EffectNotFound, EffectStatus, Runtime
from runtime.discovery import PACKAGES_GROUP, load_package_effects
from runtime.http import create_app
from runtime.testing import FakeClock

FIXTURES = Path(__file__).parent / "fixtures"
DEMO = FIXTURES / "te_demo_pkg"
APP = FIXTURES / "app"
BROKEN = ("te_broken_pkg", "te_impostor_pkg", "te_misnamed_pkg", "te_ghost_pkg")

Call = tuple[str, str, str, str | None]

pytestmark = pytest.mark.usefixtures("demo_dist")


# --------------------------------------------------------------------- installing


class _Pip:
    """Installs fixture distributions with pip, each build sharing one setuptools.

    pip's default isolated build makes a fresh environment per distribution (seconds
    each); one shared folder holding setuptools, given to ``--no-build-isolation`` builds,
    makes each build take well under a second.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._build_env: Path | None = None

    def _cmd(self) -> list[str]:
        return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]

    def start(self, source: Path, target: Path | None) -> subprocess.Popen[str]:
        """Start installing ``source`` into ``target`` (a folder), or into this environment."""
        if self._build_env is None:
            env = self.workdir / "build-env"
            # 70.1 is the first setuptools with bdist_wheel built in (no `wheel` needed).
            _finish(_popen([*self._cmd(), "--target", str(env), "setuptools>=70.1"]),
                    "setuptools")
            self._build_env = env
        # pip builds in the source tree (build/, *.egg-info): a copy keeps tests/fixtures
        # clean and lets concurrent test sessions build without stepping on each other.
        copy = Path(tempfile.mkdtemp(dir=self.workdir)) / source.name
        shutil.copytree(
            source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        cmd = [*self._cmd(), "--no-deps", "--force-reinstall", "--no-build-isolation"]
        if target is not None:
            cmd += ["--target", str(target)]
        path = [str(self._build_env), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        return _popen([*cmd, str(copy)], env)


def _popen(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _finish(proc: subprocess.Popen[str], what: str) -> None:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"pip install {what} failed:\n{output}"


def _is_installed_and_current(source: Path) -> bool:
    """Whether this environment holds ``source``'s distribution with identical files."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    try:
        dist = importlib.metadata.distribution(project["name"])
    except importlib.metadata.PackageNotFoundError:
        return False
    if dist.version != project["version"]:
        return False
    declared = set(project["entry-points"][PACKAGES_GROUP].items())
    if {(ep.name, ep.value) for ep in dist.entry_points.select(group=PACKAGES_GROUP)} != declared:
        return False
    for path in source.rglob("*.py"):
        installed = Path(str(dist.locate_file(path.relative_to(source))))
        if not installed.is_file() or installed.read_bytes() != path.read_bytes():
            return False
    return True


@pytest.fixture(scope="session")
def demo_dist() -> importlib.metadata.Distribution:
    """te-demo-pkg, really installed into this environment by pip."""
    # Several test sessions may share this environment: one installs, the others wait.
    key = hashlib.sha1(sys.prefix.encode()).hexdigest()[:12]
    lock_path = Path(tempfile.gettempdir()) / f"thread-effects-te-demo-pkg-{key}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        importlib.invalidate_caches()
        if not _is_installed_and_current(DEMO):
            with tempfile.TemporaryDirectory() as work:
                _finish(_Pip(Path(work)).start(DEMO, None), DEMO.name)
            importlib.invalidate_caches()
    # Seen by importlib.metadata in this very process, without a restart.
    assert _is_installed_and_current(DEMO)
    return importlib.metadata.distribution("te-demo-pkg")


@pytest.fixture(scope="session")
def broken_sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each broken distribution pip-installed into its own folder (not on sys.path)."""
    root = tmp_path_factory.mktemp("broken-dists")
    pip = _Pip(tmp_path_factory.mktemp("pip"))
    procs = {name: pip.start(FIXTURES / name, root / name) for name in BROKEN}
    for name, proc in procs.items():
        _finish(proc, name)
    return {name: root / name for name in BROKEN}


@contextlib.contextmanager
def visible(site: Path) -> Iterator[Path]:
    """Put an install folder on ``sys.path`` (its distributions become visible) for a while."""
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(f"{site}/"):
                del sys.modules[name]
        importlib.invalidate_caches()


# ----------------------------------------------------------------------- runtimes


@pytest.fixture
def calls() -> list[Call]:
    """What the package's (and the app's) effects recorded, in run order."""
    import te_demo_pkg

    te_demo_pkg.CALLS.clear()
    return te_demo_pkg.CALLS


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(app_dir=APP, data_dir=tmp_path / "data") as runtime:
        yield runtime


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
async def frt(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Runtime]:
    async with Runtime(app_dir=APP, data_dir=tmp_path / "data", clock=clock) as runtime:
        yield runtime


# -------------------------------------------------------------------- scheduling


async def test_app_schedules_a_package_effect_by_its_qualified_name(
    rt: Runtime, calls: list[Call]
) -> None:
    thread = await rt.create_thread()
    pkg_run = await thread.schedule_effect("te_demo/ping", {"text": "to the package"})
    app_run = await thread.schedule_effect("ping", {"text": "to the app"})
    await rt.wait_idle()

    # The same short name from the app means the app's own effect.
    assert calls == [
        ("ping", thread.thread_id, "to the package", "te_demo"),
        ("app ping", thread.thread_id, "to the app", None),
    ]
    pkg = await thread.get_run(pkg_run)
    assert (pkg.name, pkg.status, pkg.args) == (
        "te_demo/ping", EffectStatus.COMPLETED, {"text": "to the package"},
    )
    app = await thread.get_run(app_run)
    assert (app.name, app.status) == ("ping", EffectStatus.COMPLETED)
    page = await thread.list_runs(name="te_demo/ping")
    assert [r.id for r in page.runs] == [pkg_run]


async def test_a_package_effect_schedules_its_own_effect_by_short_name(
    rt: Runtime, calls: list[Call]
) -> None:
    thread = await rt.create_thread()
    await thread.schedule_effect("te_demo/relay", {"text": "hello"})
    await rt.wait_idle()

    assert calls == [
        ("relay", thread.thread_id, "hello", "te_demo"),
        ("ping", thread.thread_id, "relayed hello", "te_demo"),  # not the app's ping
    ]
    history = (await thread.list_runs()).runs
    assert [(r.name, r.status, r.args) for r in history] == [
        ("te_demo/ping", EffectStatus.COMPLETED, {"text": "relayed hello"}),
        ("te_demo/relay", EffectStatus.COMPLETED, {"text": "hello"}),
    ]


async def test_package_code_outside_effects_uses_short_names_through_for_package(
    frt: Runtime, clock: FakeClock, calls: list[Call]
) -> None:
    from te_demo_pkg.tools import remind_later

    thread = await frt.create_thread()
    run_id = await remind_later(thread, "later", delay=60)
    app_run = await thread.schedule_effect("ping", {"text": "app"}, delay=60)

    scoped = thread.for_package("te_demo")
    assert [r.id for r in await scoped.get_scheduled_effects("ping")] == [run_id]
    assert [r.id for r in await thread.get_scheduled_effects("ping")] == [app_run]
    assert [r.id for r in (await scoped.list_runs(name="ping")).runs] == [run_id]
    assert (await thread.get_run(run_id)).name == "te_demo/ping"

    clock.advance(60)
    await frt.wait_idle()
    assert sorted(calls) == [
        ("app ping", thread.thread_id, "app", None),
        ("ping", thread.thread_id, "later", "te_demo"),
    ]


async def test_package_runs_carry_their_qualified_name_in_frames(rt: Runtime) -> None:
    thread = await rt.create_thread()
    async with thread.subscribe() as sub:
        run_id = await thread.schedule_effect("te_demo/ping", {"text": "x"})
        async with asyncio.timeout(10):
            frames = [(await anext(sub)).to_frame() for _ in range(3)]

    assert [(f["eventType"], f["data"]["id"]) for f in frames] == [
        ("effect_changed", run_id)
    ] * 3
    assert [(f["data"]["name"], f["data"]["change"]) for f in frames] == [
        ("te_demo/ping", "scheduled"),
        ("te_demo/ping", "started"),
        ("te_demo/ping", "completed"),
    ]
    assert all("args" not in f["data"] for f in frames)


async def test_a_failing_package_effect_fails_and_replays_under_its_qualified_name(
    rt: Runtime,
) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("te_demo/boom")
    await rt.wait_idle()
    failed = await thread.get_run(run_id)
    assert failed.status is EffectStatus.FAILED
    assert failed.error == f"RuntimeError: boom in {thread.thread_id}"

    again = await thread.replay(run_id)
    await rt.wait_idle()
    replayed = await thread.get_run(again)
    assert (replayed.name, replayed.status, replayed.replay_of) == (
        "te_demo/boom", EffectStatus.FAILED, run_id,
    )


async def test_package_effect_args_are_checked_against_its_schema(rt: Runtime) -> None:
    thread = await rt.create_thread()
    with pytest.raises(ValueError, match=r"te_demo/ping.*text"):
        await thread.schedule_effect("te_demo/ping", {"txt": "typo"})
    assert (await thread.list_runs()).runs == []



async def test_the_api_behind_the_pane_shows_package_effects_by_qualified_name(
    tmp_path: Path, calls: list[Call]
) -> None:
    app = create_app(data_dir=tmp_path / "data", app_dir=APP, web_dir=None)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        effects = (await client.get("/api/effects")).json()["effects"]
        assert [e["name"] for e in effects] == [
            "note", "ping", "te_demo/boom", "te_demo/ping", "te_demo/relay",
        ]
        tid = (await client.post("/api/threads", json={})).json()["id"]
        res = await client.post(
            f"/api/threads/{tid}/effects", json={"name": "te_demo/relay", "args": {"text": "w"}}
        )
        assert res.status_code == 201, res.text
        await app.state.runtime.wait_idle()

        runs = (await client.get(f"/api/threads/{tid}/effects")).json()["runs"]
        assert [(r["name"], r["status"]) for r in runs] == [
            ("te_demo/ping", "completed"), ("te_demo/relay", "completed"),
        ]
        only = await client.get(f"/api/threads/{tid}/effects", params={"name": "te_demo/ping"})
        assert [r["name"] for r in only.json()["runs"]] == ["te_demo/ping"]

        missing = await client.post(
            f"/api/threads/{tid}/effects", json={"name": "te_nope/ping", "args": {"text": "w"}}
        )
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "code": "effect_not_found",
            "message": "Effect not found: te_nope/ping (no package \"te_nope\" is installed)",
        }
    assert [c[:3] for c in calls] == [("relay", tid, "w"), ("ping", tid, "relayed w")]

# ------------------------------------------------------------------ unknown names


async def test_an_unknown_package_is_effect_not_found(rt: Runtime) -> None:
    thread = await rt.create_thread()
    with pytest.raises(EffectNotFound) as info:
        await thread.schedule_effect("te_nope/ping", {"text": "x"})
    assert str(info.value) == "Effect not found: te_nope/ping (no package \"te_nope\" is installed)"
    assert info.value.name == "te_nope/ping"
    assert (await thread.list_runs()).runs == []


async def test_an_unknown_effect_of_a_known_package_is_effect_not_found(rt: Runtime) -> None:
    thread = await rt.create_thread()
    with pytest.raises(EffectNotFound) as info:
        await thread.schedule_effect("te_demo/note")  # the app has a "note"; te_demo has not
    assert str(info.value) == (
        "Effect not found: te_demo/note (package \"te_demo\" has no effect \"note\")"
    )
    assert (await thread.list_runs()).runs == []


async def test_inside_a_package_a_short_name_never_reaches_the_apps_effect(
    rt: Runtime, calls: list[Call]
) -> None:
    thread = await rt.create_thread()
    with pytest.raises(EffectNotFound, match=r"package \"te_demo\" has no effect \"note\""):
        await thread.for_package("te_demo").schedule_effect("note")
    with pytest.raises(EffectNotFound, match=r"package \"te_nope\", which is not installed"):
        await thread.for_package("te_nope").schedule_effect("ping", {"text": "x"})

    # Back in the app's scope, "note" is the app's effect.
    await thread.for_package("te_demo").for_package(None).schedule_effect("note")
    await rt.wait_idle()
    assert calls == [("app note", thread.thread_id, "", None)]


async def test_with_load_packages_off_no_package_effect_exists(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.create_thread()
        with pytest.raises(EffectNotFound) as info:
            await thread.schedule_effect("te_demo/ping", {"text": "x"})
        assert str(info.value) == (
            "Effect not found: te_demo/ping (package \"te_demo\" cannot be used: packages are "
            "not loaded (load_packages=False))"
        )
        with pytest.raises(EffectNotFound, match=r'"te_demo", but packages are not loaded'):
            await thread.for_package("te_demo").schedule_effect("ping", {"text": "x"})


# --------------------------------------------------------------- startup errors


async def start_fails(data_dir: Path) -> str:
    with pytest.raises(EffectDefinitionError) as info:
        async with Runtime(app_dir=APP, data_dir=data_dir):
            pass
    return str(info.value)


async def test_a_bad_effect_file_in_a_package_stops_startup(
    tmp_path: Path, broken_sites: dict[str, Path]
) -> None:
    with visible(broken_sites["te_broken_pkg"]) as site:
        message = await start_fails(tmp_path)
    bad_file = site / "te_broken_pkg" / "effects" / "broken.py"
    assert message == (
        f"package 'te_broken' (distribution te-broken-pkg 0.1.0 (in {site})): "
        f"{bad_file}: import failed (line 1): "
        f"ModuleNotFoundError: No module named 'te_broken_pkg_no_such_module'"
    )
    # Nothing was left behind: once the package is gone, the same data dir starts.
    async with Runtime(app_dir=APP, data_dir=tmp_path) as rt:
        thread = await rt.create_thread()
        with pytest.raises(EffectNotFound, match='no package "te_broken" is installed'):
            await thread.schedule_effect("te_broken/fine")


async def test_two_distributions_cannot_claim_one_package_id(
    tmp_path: Path, broken_sites: dict[str, Path], demo_dist: importlib.metadata.Distribution
) -> None:
    with visible(broken_sites["te_impostor_pkg"]) as site:
        message = await start_fails(tmp_path)
    assert message.startswith("packageId 'te_demo' is claimed by 2 distributions: ")
    assert message.endswith(". A packageId names one package: uninstall one of them")
    assert f"te-demo-pkg 0.1.0 (in {demo_dist.locate_file('')}) as 'te_demo_pkg'" in message
    assert f"te-impostor-pkg 0.1.0 (in {site}) as 'te_impostor_pkg'" in message


async def test_an_invalid_package_id_stops_startup(
    tmp_path: Path, broken_sites: dict[str, Path]
) -> None:
    with visible(broken_sites["te_misnamed_pkg"]):
        message = await start_fails(tmp_path)
    assert message.startswith("packageId 'Te.Misnamed' of distribution te-misnamed-pkg 0.1.0")
    assert "^[a-z][a-z0-9_-]*$" in message


async def test_an_entry_point_that_cannot_be_imported_stops_startup(
    tmp_path: Path, broken_sites: dict[str, Path]
) -> None:
    with visible(broken_sites["te_ghost_pkg"]):
        message = await start_fails(tmp_path)
    assert message.startswith("package 'te_ghost' (distribution te-ghost-pkg 0.1.0 (in ")
    assert message.endswith(
        "cannot import 'te_ghost_pkg.missing': "
        "ModuleNotFoundError: No module named 'te_ghost_pkg.missing'"
    )


# ------------------------------------------------- one package, from its entry point


def test_a_package_exports_one_effect_per_file_of_its_effects_folder(
    demo_dist: importlib.metadata.Distribution,
) -> None:
    (ep,) = demo_dist.entry_points.select(group=PACKAGES_GROUP)
    effects = load_package_effects(ep.name, ep)

    # _args.py and __init__.py are helpers, not effects.
    assert sorted(effects) == ["boom", "ping", "relay"]
    assert [effects[n].qualified_name for n in sorted(effects)] == [
        "te_demo/boom", "te_demo/ping", "te_demo/relay",
    ]
    assert effects["ping"].description == "Records a ping (package te_demo)."
    assert effects["ping"].args_json_schema() is not None
    assert effects["boom"].schema is None and not effects["boom"].is_async
    # Imported as part of the package, so its code shares the package's modules.
    assert effects["ping"].fn.__module__ == "te_demo_pkg.effects.ping"


def test_an_entry_point_value_must_name_a_package() -> None:
    with pytest.raises(EffectDefinitionError) as info:
        load_package_effects(
            "te_demo", importlib.metadata.EntryPoint("te_demo", "te_demo_pkg.tools", PACKAGES_GROUP)
        )
    assert str(info.value) == (
        "package 'te_demo' (distribution an unknown distribution): 'te_demo_pkg.tools' is a "
        "module, not a package; a package's effects live in the effects/ folder of the "
        "package named by the entry point"
    )
    with pytest.raises(EffectDefinitionError, match=r"'te_demo_pkg:record' must name a package"):
        load_package_effects(
            "te_demo",
            importlib.metadata.EntryPoint("te_demo", "te_demo_pkg:record", PACKAGES_GROUP),
        )

