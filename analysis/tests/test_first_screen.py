"""The report answers on its first screen: the HTML report of the example dataset, opened
in headless Chromium (Debian's chromium package) at 1400×900, shows the summary table and
the headline figure without scrolling. A script added to a copy of the page writes the
bounding boxes of both into the DOM, which `--dump-dom` returns; a screenshot of that
first screen is kept in the test's folder."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

DATASET = Path(__file__).resolve().parents[2] / "examples" / "gpt2-small-strong-4xh200"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser")
                 if shutil.which(name)), None)
WIDTH, HEIGHT = 1400, 900

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian "
                       "package chromium; jobscripts/install-deps.sh installs it)"),
    pytest.mark.skipif(not DATASET.is_dir(), reason=f"{DATASET} is missing"),
]

# Runs after html.SCRIPT's load handler: the boxes of the summary's first table and first
# figure (the elements between the heading `summary` and the next h2), in CSS pixels of
# the viewport, as a JSON attribute of <body>. A figure counts once it has decoded, since
# an image without its size has no height yet.
POSITIONS = """
<script>
window.addEventListener("load", function () {
  var found = {}, node = document.getElementById("summary");
  for (node = node && node.nextElementSibling; node && node.tagName !== "H2";
       node = node.nextElementSibling) {
    var table = node.tagName === "TABLE" ? node : null;
    var image = node.tagName === "IMG" ? node : node.querySelector && node.querySelector("img");
    if (table && !found.table) found.table = table;
    if (image && !found.image) found.image = image;
  }
  var boxes = {viewport: [window.innerWidth, window.innerHeight]};
  ["table", "image"].forEach(function (name) {
    if (!found[name]) return;
    var box = found[name].getBoundingClientRect();
    boxes[name] = {left: box.left, top: box.top, right: box.right, bottom: box.bottom,
                   rendered: name !== "image" || found[name].naturalWidth > 0};
  });
  document.body.setAttribute("data-first-screen", JSON.stringify(boxes));
});
</script>
"""


def chromium(*arguments, cwd):
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={cwd / 'chromium-profile'}", "--virtual-time-budget=10000",
               f"--window-size={WIDTH},{HEIGHT}", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True, cwd=cwd)


def first_screen(page, tmp_path):
    """The summary table's and headline figure's boxes in a 1400×900 viewport."""
    probe = tmp_path / f"probe_{page.name}"
    probe.write_text(page.read_text(encoding="utf-8").replace("</head>", POSITIONS + "</head>", 1),
                     encoding="utf-8")
    dom = chromium("--dump-dom", probe.as_uri(), cwd=tmp_path).stdout
    match = re.search(r'data-first-screen="([^"]*)"', dom)
    assert match, dom[-2000:]
    return json.loads(match.group(1).replace("&quot;", '"'))


def problems_above_the_fold(boxes):
    """What keeps the summary table or the headline figure off the first screen; empty
    when both lie wholly inside the viewport."""
    width, height = boxes["viewport"]
    problems = []
    for name in ("table", "image"):
        box = boxes.get(name)
        if box is None:
            problems.append(f"no summary {name}")
            continue
        if not box["rendered"]:
            problems.append(f"the summary {name} did not render")
        if box["top"] < 0 or box["left"] < 0 or box["bottom"] > height or box["right"] > width:
            problems.append(f"the summary {name} lies at {box}, outside {width}×{height}")
    return problems


@pytest.fixture(scope="module")
def example_page(example_report):
    return example_report / "report.html"


def test_the_summary_table_and_headline_figure_fill_the_first_screen(example_page, tmp_path):
    boxes = first_screen(example_page, tmp_path)
    # A window of 1400×900 leaves the page what the browser's own bars do not take.
    assert boxes["viewport"][0] == WIDTH and boxes["viewport"][1] <= HEIGHT
    assert problems_above_the_fold(boxes) == [], boxes
    shot = tmp_path / "first-screen.png"
    chromium(f"--screenshot={shot}", example_page.as_uri(), cwd=tmp_path)
    assert matplotlib.image.imread(shot).shape[:2] == (HEIGHT, WIDTH)


def test_a_summary_below_the_fold_is_caught(example_page, tmp_path):
    # The check above can fail: the same page with the summary pushed down by one screen.
    moved = tmp_path / "moved.html"
    moved.write_text(example_page.read_text(encoding="utf-8").replace(
        '<h2 id="summary">', f'<div style="height:{HEIGHT}px"></div><h2 id="summary">', 1),
        encoding="utf-8")
    problems = problems_above_the_fold(first_screen(moved, tmp_path))
    assert len(problems) == 2 and all("outside" in problem for problem in problems), problems
