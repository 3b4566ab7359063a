"""One self-contained HTML file from a report's markdown: the figures embedded as base64
PNG, the style inline, nothing fetched, so it reads offline on any laptop. Converts the
subset of markdown the reports write: headings, paragraphs, lists with continuation
lines, tables, images, links, bold, italics and code spans."""
import base64
import html
import re
from pathlib import Path

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1200px;
       margin: 2em auto; padding: 0 1em; line-height: 1.45; color: #222; }
h1, h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .88em; display: block;
        overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0; }
code { background: #f5f5f5; padding: 0 .2em; border-radius: 3px; }
/* The summary's first screen: each study's headline figure right of its table and text. */
section.summary img { float: right; width: 46%; margin: 0 0 .5em 1.5em; }
section.summary h3 { clear: both; }
section.summary::after { content: ""; display: block; clear: both; }
.broken { color: #b00; font-weight: bold; border: 2px dashed #b00; padding: .5em; }
"""

# Marks each figure once the page has loaded: data-rendered="yes" when the browser decoded
# it, and a visible notice in place of one it could not.
SCRIPT = """
window.addEventListener("load", function () {
  var figures = document.querySelectorAll("img"), shown = 0;
  figures.forEach(function (img) {
    var ok = img.complete && img.naturalWidth > 0;
    img.setAttribute("data-rendered", ok ? "yes" : "no");
    if (ok) { shown += 1; return; }
    var notice = document.createElement("p");
    notice.className = "broken";
    notice.textContent = "This figure did not render: " + img.alt;
    img.insertAdjacentElement("afterend", notice);
  });
  document.body.setAttribute("data-figures", shown + "/" + figures.length);
});
"""

_CODE = re.compile(r"`([^`]+)`")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?![*\w])")


def _data_uri(path):
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def inline(text, base_dir):
    """Escapes text and turns code spans, images, links, bold and italics into HTML;
    a code span's content is left as written."""
    codes = []

    def keep_code(match):
        codes.append(f"<code>{html.escape(match.group(1))}</code>")
        return f"\x00{len(codes) - 1}\x00"

    text = _CODE.sub(keep_code, text)
    text = html.escape(text, quote=False)

    def image(match):
        alt, source = match.group(1), match.group(2)
        path = Path(base_dir) / html.unescape(source)
        src = _data_uri(path) if path.is_file() else html.escape(source)
        return f'<img alt="{html.escape(html.unescape(alt))}" src="{src}">'

    text = _IMAGE.sub(image, text)
    text = _LINK.sub(lambda m: f'<a href="{m.group(2)}">{m.group(1)}</a>', text)
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    text = _ITALIC.sub(r"<em>\1</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], text)


def _cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table(lines, base_dir):
    header, rows = _cells(lines[0]), [_cells(line) for line in lines[2:]]
    head = "".join(f"<th>{inline(cell, base_dir)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{inline(cell, base_dir)}</td>" for cell in row)
                   + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _blocks(lines):
    """Groups lines into (kind, lines): heading, table, list, code or paragraph."""
    blocks, index = [], 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1
        elif line.startswith("```"):
            end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")),
                       len(lines))
            blocks.append(("code", lines[index + 1:end]))
            index = end + 1
        elif re.match(r"#{1,6} ", line):
            blocks.append(("heading", [line]))
            index += 1
        else:
            kind = ("table" if line.startswith("|") else
                    "list" if line.startswith("- ") else "paragraph")
            end = index + 1
            while end < len(lines) and lines[end].strip() and not re.match(r"#{1,6} ", lines[end]):
                if kind == "table" and not lines[end].startswith("|"):
                    break
                if kind == "paragraph" and lines[end].startswith(("|", "- ")):
                    break
                end += 1
            blocks.append((kind, lines[index:end]))
            index = end
    return blocks


def _list(lines, base_dir):
    items = []
    for line in lines:
        if line.startswith("- "):
            items.append(line[2:].strip())
        else:  # a continuation line of the item above
            items[-1] += " " + line.strip()
    return "<ul>" + "".join(f"<li>{inline(item, base_dir)}</li>" for item in items) + "</ul>"


def heading_id(text, taken):
    """An anchor for a heading, unique in its page: its words in lower case joined by
    hyphens ("## Where the scaling went" → where-the-scaling-went), then -2, -3 ... where
    the same words head several sections. Links and tests find a section by it."""
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    anchor, count = base, 1
    while anchor in taken:
        count += 1
        anchor = f"{base}-{count}"
    taken.add(anchor)
    return anchor


def markdown_to_html(text, base_dir, title):
    """The page; each second-level heading opens a <section> named by its anchor, which
    the style may lay out (the summary sets its figures beside its tables)."""
    parts, anchors, in_section = [], set(), False
    for kind, lines in _blocks(text.splitlines()):
        if kind == "heading":
            level = len(lines[0]) - len(lines[0].lstrip("#"))
            words = lines[0][level:].strip()
            anchor = heading_id(words, anchors)
            if level <= 2:
                parts.append("</section>" if in_section else "")
                parts.append(f'<section class="{anchor}">' if level == 2 else "")
                in_section = level == 2
            parts.append(f'<h{level} id="{anchor}">{inline(words, base_dir)}</h{level}>')
        elif kind == "table":
            parts.append(_table(lines, base_dir))
        elif kind == "list":
            parts.append(_list(lines, base_dir))
        elif kind == "code":
            parts.append("<pre><code>" + html.escape("\n".join(lines)) + "</code></pre>")
        else:
            parts.append(f"<p>{inline(' '.join(line.strip() for line in lines), base_dir)}</p>")
    parts.append("</section>" if in_section else "")
    parts = [part for part in parts if part]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"<script>{SCRIPT}</script></head>\n<body>\n" + "\n".join(parts)
            + "\n</body></html>\n")


def write_html(markdown_path):
    """Writes the HTML twin of a markdown report beside it (report.md → report.html)."""
    markdown_path = Path(markdown_path)
    text = markdown_path.read_text(encoding="utf-8")
    first = next((line for line in text.splitlines() if line.startswith("# ")), "# report")
    target = markdown_path.with_suffix(".html")
    target.write_text(markdown_to_html(text, markdown_path.parent, first[2:].strip()),
                      encoding="utf-8")
    return target
