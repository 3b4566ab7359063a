"""The analysis package's layers, read from its source: `results/` (reading files, series,
metrics) is the ground the other subpackages stand on and imports none of them, and no
module imports a name another module keeps private (a leading underscore; a dunder such as
__version__ is public)."""
import ast
from pathlib import Path

import scalestudy_analysis

PACKAGE = Path(scalestudy_analysis.__file__).parent
GROUND = "results"


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
    """'report' for scalestudy_analysis.report.markdown; '' for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_its_subpackages():
    # Guards the checks below against a moved package, where they would pass on nothing.
    assert {path.parent.name for path in modules()} >= {"results", "report", "compare", "predict", "bench"}


def test_results_imports_no_other_subpackage():
    upward = [f"{path.relative_to(PACKAGE)}:{line} imports {module}"
              for path in modules() if path.parent.name == GROUND
              for line, module, _ in imports(path) if subpackage(module) not in ("", GROUND)]
    assert upward == []


def test_no_module_imports_another_modules_private_name():
    private = [f"{path.relative_to(PACKAGE)}:{line} imports {name} from {module}"
               for path in modules() for line, module, names in imports(path)
               for name in names if name.startswith("_") and not name.endswith("__")]
    assert private == []
