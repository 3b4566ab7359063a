"""report.html and compare.html: one self-contained file each, every figure embedded, and,
in headless Chromium (Debian's chromium package), every figure rendered."""
import base64
import re
import shutil
import subprocess

import matplotlib.image
import pytest

from scalestudy_analysis.report.cli import main
from scalestudy_analysis.render.html import markdown_to_html
from synth import base_config, write_run

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser")
                 if shutil.which(name)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                    "(Debian package chromium; jobscripts/install-deps.sh installs it)")
# Saturated pixels (the figures' lines and bars; text and tables are black and grey) that
# a screenshot of the first 4000 pixels must hold. The same pages with their figures
# taken out have none; the compare page's one figure of error bars draws some 1300, the
# report's first figures tens of thousands.
MIN_COLOURED_PIXELS = 500


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    for n in (1, 2):
        for repeat in range(3):
            for label, factor in (("a", 1.0), ("b", 1.05)):
                write_run(root / label / f"n{n}r{repeat}.h5", world_size=n,
                          step_times=factor * (0.1 + 0.1 / n), config=base_config(repeat=repeat))
    assert main([str(root / "a"), "-o", str(root / "report")]) == 0
    assert main(["compare", str(root / "a"), str(root / "b"), "-o", str(root / "compare")]) == 0
    return root


def chromium(*arguments, cwd):
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={cwd / 'chromium-profile'}", "--virtual-time-budget=10000",
               *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True, cwd=cwd)


@pytest.mark.parametrize("name", ["report/report", "compare/compare"])
def test_the_html_is_one_file_with_every_figure_embedded(reports, name):
    markdown = (reports / f"{name}.md").read_text()
    page = (reports / f"{name}.html").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert figures and all((reports / name).parent.joinpath(f).is_file() for f in figures)
    sources = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(sources) == len(figures)
    for source, figure in zip(sources, figures):
        assert source.startswith("data:image/png;base64,")
        png = base64.b64decode(source.split(",", 1)[1])
        assert png == (reports / name).parent.joinpath(figure).read_bytes()
    assert not re.search(r'(src|href)="(https?:|file:|//)', page)
    assert "<link" not in page and page.count("<table>") == markdown.count("\n|---")


@needs_chromium
@pytest.mark.parametrize("name", ["report/report", "compare/compare"])
def test_every_figure_renders_in_headless_chromium(reports, name, tmp_path):
    page = reports / f"{name}.html"
    figures = len(re.findall(r"<img ", page.read_text()))
    dom = chromium("--dump-dom", page.as_uri(), cwd=tmp_path).stdout
    assert dom.count('data-rendered="yes"') == figures, dom[-2000:]
    assert f'data-figures="{figures}/{figures}"' in dom
    assert '<p class="broken">' not in dom
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,4000", page.as_uri(), cwd=tmp_path)
    pixels = matplotlib.image.imread(shot)[..., :3]
    saturation = pixels.max(axis=2) - pixels.min(axis=2)
    assert int((saturation > 0.3).sum()) >= MIN_COLOURED_PIXELS


@needs_chromium
def test_a_figure_that_cannot_render_is_caught(tmp_path):
    # The check above can fail: a PNG whose bytes are corrupt is marked, and said so.
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    page = tmp_path / "bad.html"
    page.write_text(markdown_to_html("# t\n\n![a broken figure](bad.png)\n", tmp_path, "t"))
    dom = chromium("--dump-dom", page.as_uri(), cwd=tmp_path).stdout
    assert 'data-rendered="no"' in dom and 'data-figures="0/1"' in dom
    assert '<p class="broken">This figure did not render: a broken figure</p>' in dom


def test_markdown_subset_converts_as_written(tmp_path):
    text = ("# Title\n\nA *note* with **bold**, `a_b*c*` and [a link](x.md).\n\n"
            "- one\n  continued\n- two\n\n| h1 | h2 |\n|---|---|\n| 1 < 2 | `x` |\n")
    page = markdown_to_html(text, tmp_path, "Title")
    assert '<h1 id="title">Title</h1>' in page
    assert "<p>A <em>note</em> with <strong>bold</strong>, <code>a_b*c*</code> and " \
           '<a href="x.md">a link</a>.</p>' in page
    assert "<ul><li>one continued</li><li>two</li></ul>" in page
    assert "<th>h1</th><th>h2</th>" in page and "<td>1 &lt; 2</td><td><code>x</code></td>" in page
