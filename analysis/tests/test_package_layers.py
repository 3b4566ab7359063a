"""The analysis package's layers, read from its source: each subpackage imports only those
below it, `results/` (reading files, series, metrics) at the bottom, then `render/` (the
formats and figure parts the reports share), `bench/` and `compare/`, `report/` and
`predict/` at the top; and no module imports a name another module keeps private (a
leading underscore; a dunder such as __version__ is public)."""
import ast
from pathlib import Path

import scalestudy_analysis

PACKAGE = Path(scalestudy_analysis.__file__).parent
# A subpackage may import its own modules and those of the levels below its own.
LEVELS = {"results": 0, "render": 1, "bench": 2, "compare": 2, "report": 3, "predict": 4}


def imports(path):
    """(line, module, names) of each import of the package's own modules in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scalestudy_analysis"):
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names
                      if alias.name.startswith("scalestudy_analysis")]
    return found


def subpackage(module):
    """'report' for scalestudy_analysis.render.markdown; '' for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_subpackage_has_a_level():
    # Guards the check below against a moved or added subpackage, which it would not see.
    assert {path.parent.name for path in modules() if path.parent != PACKAGE} == set(LEVELS)


def allowed(importer, imported):
    return imported in ("", importer) or LEVELS[imported] < LEVELS[importer]


def test_each_subpackage_imports_only_those_below_it():
    upward = [f"{path.relative_to(PACKAGE)}:{line} imports {module}"
              for path in modules() if path.parent != PACKAGE
              for line, module, _ in imports(path) if not allowed(path.parent.name, subpackage(module))]
    assert upward == []


def test_no_module_imports_another_modules_private_name():
    private = [f"{path.relative_to(PACKAGE)}:{line} imports {name} from {module}"
               for path in modules() for line, module, names in imports(path)
               for name in names if name.startswith("_") and not name.endswith("__")]
    assert private == []
