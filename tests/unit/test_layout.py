"""The package's layout rules, read from the source's import statements (no module is imported).

- At the top of `kvlab/` only the core every wing reads (CORE); everything else lives in a wing's folder. The core
  imports no tab's wing and no front (TAB_WINGS_AND_FRONTS).
- `kvlab/ui/` is one package per tab (TABS) plus `shared` (what tabs share) and `hosting` (how the app is served:
  agent tools, run costs and turns, queue, shutdown, ZeroGPU); a tab imports `shared` and `hosting`, never another
  tab; `shared` imports no tab, `hosting` neither a tab nor `shared`.
- No import circle between files, and none between rooms (a top module, a wing's folder, a tab's package),
  so no import runs back up; `measure/` imports nothing but itself.
- Only `kvlab/ui/` (and app.py, outside the package) imports gradio.
- No module in `kvlab/ui/` imports the CLI (`kvlab/cli/`): what a tab or an agent tool shares with a subcommand
  lives in the wing both call.
- No file in `kvlab/` imports playwright (the bench's browser driver belongs outside the installed package).
- Weight-free modules (the planner wing, the preset schema, the columns) import neither the runner nor the
  modules that run a model.
- No file in the package, benchmarks/ or app.py is longer than 450 lines, and no function longer than 60.
- No module outside the quantization backends' home (`kvlab/caches/quant/`) branches on a backend's name: a
  backend is looked up in the registry and asked, so a new one is its module and one registry line.
- The run events every wing shares (started, column failed, done with its record) are `kvlab/protocol.py`'s; a
  run wing (Compare, Needle, the report) defines only its own step events.
- One module reads and builds a record's envelope (`kvlab/record.py`: `kind`, `version`, the keys older records
  carried, and the safe JSON loader's one caller); a wing describes its kind and writes through it.
"""

import ast
import graphlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kvlab"
WEIGHT_FREE = ("kvlab.plan", "kvlab.presets", "kvlab.compare.preset", "kvlab.columns", "kvlab.compare.columns", "kvlab.quality.stats",
               "kvlab.quality.record", "kvlab.quality.table", "kvlab.quality.defaults")
RUNTIME_MODULES = ("kvlab.compare.runner", "kvlab.engine", "kvlab.compare.timing", "kvlab.compare.quiet",
                   "kvlab.measure.warmup", "kvlab.compare.memory", "kvlab.compare.fidelity", "kvlab.compare.summary")
"""What runs (and times) a model: a weight-free module needs none of them."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file, relative imports resolved to absolute names."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def starts_with(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


SOURCES = {module_name(path): imported_modules(path) for path in sorted(PACKAGE.rglob("*.py"))}


def offenders(modules, imported: tuple[str, ...]) -> dict[str, list[str]]:
    return {name: sorted(i for i in SOURCES[name] if starts_with(i, imported)) for name in modules
            if any(starts_with(i, imported) for i in SOURCES[name])}


CORE = {"engine", "generation", "accounting", "compute", "budget", "presets", "columns", "record", "protocol"}
"""The modules at the top of kvlab/ (beside __init__ and __main__): what every wing reads (`columns`: a run's
columns and the one check of them, `kvlab.columns.parse_columns`; `record`: the one record envelope and its
reader; `protocol`: the events every wing's run streams)."""
TABS = {"compare", "chat", "perplexity", "plan", "inspect", "needle", "report"}
"""kvlab/ui/'s tab packages; `shared` and `hosting` are the packages beside them."""
BESIDE_TABS = {"shared", "hosting"}


def owner(name: str) -> str | None:
    """The module of SOURCES that an imported name (a module, or a name inside one) belongs to."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


def room(module: str) -> str:
    """The room a module stands in: a tab's package under kvlab.ui, a wing's folder, or a top module."""
    parts = module.split(".")
    if parts[:2] == ["kvlab", "ui"] and len(parts) > 3:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def file_arrows() -> dict[str, set[str]]:
    """module -> the package modules it imports (at any depth of the file), itself and parent faces left out."""
    arrows = {}
    for name, imported in SOURCES.items():
        targets = {owner(i) for i in imported if i == "kvlab" or i.startswith("kvlab.")}
        arrows[name] = {t for t in targets if t and t != name and not name.startswith(t + ".")}
    return arrows


def room_arrows() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for name, targets in file_arrows().items():
        rooms.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    return rooms


def circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of `graph` (each node imports the next), or [] when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return []


def test_no_import_circle_between_files_or_rooms():
    assert circle({"a": {"b"}, "b": {"a"}}) and not circle({"a": {"b"}, "b": set()})
    assert room("kvlab.ui.compare.tab") == "kvlab.ui.compare" and room("kvlab.eviction.kept") == "kvlab.eviction"
    assert "kvlab.eviction.kept" in file_arrows()["kvlab.eviction.prefill"]
    assert circle(file_arrows()) == []
    assert circle(room_arrows()) == []


def test_only_the_core_stands_at_the_top_of_the_package():
    flat = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert flat == CORE


TAB_WINGS_AND_FRONTS = ("kvlab.compare", "kvlab.needle", "kvlab.quality", "kvlab.chat", "kvlab.inspect", "kvlab.plan",
                        "kvlab.cli", "kvlab.ui", "kvlab.bench")
"""The wings behind a tab and the fronts: the core reads none of them (the machinery they share, strategies,
caches, models, measure, it may)."""


def test_the_core_imports_no_tab_wing_and_no_front():
    """A wing's own schema (Compare's presets, say) lives in its wing, not in the core every wing reads."""
    assert offenders([f"kvlab.{name}" for name in CORE], TAB_WINGS_AND_FRONTS) == {}


def test_the_ui_is_one_package_per_tab_and_tabs_import_only_shared_and_hosting():
    ui = PACKAGE / "ui"
    assert [path.name for path in ui.glob("*.py")] == ["__init__.py"]
    assert {path.parent.name for path in ui.glob("*/__init__.py")} == TABS | BESIDE_TABS
    tabs = {f"kvlab.ui.{tab}" for tab in TABS}
    beside = {f"kvlab.ui.{name}" for name in BESIDE_TABS}
    crossing = {source: sorted(targets & (tabs - {source}))
                for source, targets in room_arrows().items() if source in tabs | beside}
    assert {source: targets for source, targets in crossing.items() if targets} == {}
    assert room_arrows()["kvlab.ui.hosting"].isdisjoint(tabs | {"kvlab.ui.shared"})


def test_measure_imports_nothing_but_itself():
    assert room_arrows()["kvlab.measure"] <= {"kvlab"}


def test_the_rules_see_the_package():
    assert {"kvlab.compare.runner", "kvlab.columns", "kvlab.plan.planner", "kvlab.cli",
            "kvlab.ui.compare.tab"} <= set(SOURCES)
    assert offenders(["kvlab.ui.compare.tab"], ("gradio",))
    assert offenders(["kvlab.cli.compare"], ("kvlab.compare.runner",))


def test_only_the_ui_imports_gradio():
    assert offenders([name for name in SOURCES if not starts_with(name, ("kvlab.ui",))], ("gradio",)) == {}


def test_the_ui_does_not_import_the_cli():
    assert offenders(["kvlab.cli.diverge"], ("kvlab.inspect",))
    assert offenders([name for name in SOURCES if starts_with(name, ("kvlab.ui",))], ("kvlab.cli",)) == {}


def test_no_module_imports_playwright():
    assert offenders(list(SOURCES), ("playwright",)) == {}


def test_weight_free_modules_do_not_import_the_runtime():
    weight_free = [name for name in SOURCES if starts_with(name, WEIGHT_FREE)]
    assert "kvlab.plan.planner" in weight_free and "kvlab.compare.preset" in weight_free
    assert offenders(weight_free, RUNTIME_MODULES) == {}


QUANT_HOME = PACKAGE / "caches" / "quant"
"""The quantization backends' home: the one place a backend's name may decide anything."""


def backend_names() -> set[str]:
    """The names the backend modules register (`register_backend(SomeBackend(name="..."))`), read from source."""
    names = set()
    for path in QUANT_HOME.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_backend":
                names.update(keyword.value.value for call in ast.walk(node) if isinstance(call, ast.Call)
                             for keyword in call.keywords
                             if keyword.arg == "name" and isinstance(keyword.value, ast.Constant))
    return names


def name_branches(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a name of `names` is compared (==, !=, in, is, or inside a literal on either side), keys a dict
    literal, or is a `case` pattern: a branch or a table on it."""
    def constants(node):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [item.value for item in items if isinstance(item, ast.Constant)]

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = any(value in names for side in [node.left, *node.comparators] for value in constants(side))
        elif isinstance(node, ast.Dict):
            hit = any(key is not None and value in names for key in node.keys for value in constants(key))
        else:
            hit = isinstance(node, ast.MatchValue) and any(value in names for value in constants(node.value))
        if hit:
            lines.append(node.lineno)
    return lines


def test_no_backend_name_branch_outside_the_backend_objects():
    names = backend_names()
    assert {"quanto", "hqq", "fp8", "rotation"} <= names
    sample = 'if backend == "fp8":\n    pass\nx = {"hqq": 1, "other": 2}\ny = b in ("quanto", "z")\nz = {"backend": "hqq"}'
    assert name_branches(ast.parse(sample), names) == [1, 3, 4]
    found = {str(path.relative_to(PACKAGE.parent)): name_branches(ast.parse(path.read_text(encoding="utf-8")), names)
             for path in sorted(PACKAGE.rglob("*.py")) if QUANT_HOME not in path.parents}
    assert {path: lines for path, lines in found.items() if lines} == {}


RECORD_READER = PACKAGE / "record.py"
"""The one reader (and writer) of a record's envelope: `kind`, `version` and the keys older records carried."""
ENVELOPE_KEYS = {"kind", "version", "format", "format_version"}


def envelope_uses(tree: ast.AST) -> list[int]:
    """Lines that read a record's envelope (a subscript or `.get` of an envelope key, a call of the safe JSON
    loader `load_json`) or build one (a dict literal with `kind` and `version`, or with `format_version`)."""
    def key(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            hit = key(node.slice) in ENVELOPE_KEYS
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            hit = name == "load_json" or (name == "get" and bool(node.args) and key(node.args[0]) in ENVELOPE_KEYS)
        elif isinstance(node, ast.Dict):
            keys = {key(k) for k in node.keys if k is not None}
            hit = {"kind", "version"} <= keys or "format_version" in keys
        else:
            hit = False
        if hit:
            lines.append(node.lineno)
    return lines


def test_one_module_reads_and_writes_a_records_envelope():
    sample = ('a = r["kind"]\nb = r.get("format_version")\nc = load_json(p)\nd = {"kind": k, "version": 1}\n'
              'e = {"kind": 1}')
    assert envelope_uses(ast.parse(sample)) == [1, 2, 3, 4]
    assert envelope_uses(ast.parse(RECORD_READER.read_text(encoding="utf-8")))
    loader = PACKAGE / "measure" / "record_json.py"
    found = {str(path.relative_to(PACKAGE.parent)): envelope_uses(ast.parse(path.read_text(encoding="utf-8")))
             for path in sorted(PACKAGE.rglob("*.py")) if path not in (RECORD_READER, loader)}
    assert {path: lines for path, lines in found.items() if lines} == {}


RUN_WINGS = ("compare", "needle", "quality")
"""The wings whose runs stream the run protocol (`kvlab.protocol`)."""
RUN_EVENT = re.compile(r"\w*(Started|ColumnError|ColumnFailed|Done)")


def run_level_events(tree: ast.AST) -> list[str]:
    """Classes named like a run's started / column-error / done event: every column error, and a started or done
    event that is not a column's own step event (whose first field is its `column`, e.g. Compare's
    `ColumnStarted`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and RUN_EVENT.fullmatch(node.name):
            fields = [item.target.id for item in node.body if isinstance(item, ast.AnnAssign)]
            if node.name.endswith(("ColumnError", "ColumnFailed")) or fields[:1] != ["column"]:
                found.append(node.name)
    return found


def test_the_run_events_every_wing_shares_are_defined_once_in_the_core():
    assert run_level_events(ast.parse("class RunDone:\n    record: dict\nclass ColumnDone:\n    column: int")) == [
        "RunDone"]
    assert run_level_events(ast.parse((PACKAGE / "protocol.py").read_text(encoding="utf-8"))) == [
        "RunStarted", "ColumnFailed", "RunDone"]
    found = {str(path.relative_to(PACKAGE.parent)): run_level_events(ast.parse(path.read_text(encoding="utf-8")))
             for wing in RUN_WINGS for path in sorted((PACKAGE / wing).rglob("*.py"))}
    assert found and {path: names for path, names in found.items() if names} == {}


MAX_FILE_LINES = 450
"""A module longer than this is split by what it does."""
MAX_FUNCTION_LINES = 60
"""A longer function is split into named steps."""
CHECKED_FOLDERS = (PACKAGE, PACKAGE.parent / "benchmarks")


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """(lines per file, lines per function) over the package, benchmarks/ and app.py."""
    paths = [p for folder in CHECKED_FOLDERS for p in sorted(folder.rglob("*.py"))] + [PACKAGE.parent / "app.py"]
    files, functions = {}, {}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(PACKAGE.parent))
        files[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{name}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    return files, functions


def test_no_file_or_function_is_too_long():
    files, functions = sizes()
    assert "kvlab/compare/runner.py" in files and any(key.startswith("app.py:") for key in functions)
    assert {name: n for name, n in files.items() if n > MAX_FILE_LINES} == {}
    assert {name: n for name, n in functions.items() if n > MAX_FUNCTION_LINES} == {}


def test_no_file_holds_a_merge_conflict_marker():
    """A merge once committed `<<<<<<< HEAD` into kvlab/compare/summary.py and every command died on import."""
    import re
    import subprocess

    root = Path(__file__).resolve().parents[2]
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.yaml", "*.sh", "*.txt", "*.toml"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    marker = re.compile(r"^(<{7}|>{7}) |^={7}$", re.M)
    marked = [name for name in files if (root / name).is_file() and marker.search((root / name).read_text(errors="replace"))]
    assert marked == []
