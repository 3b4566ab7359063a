import sys
from pathlib import Path

# The synthetic-file writer lives next to the tests, not in the package.
sys.path.insert(0, str(Path(__file__).parent))
