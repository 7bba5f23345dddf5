"""comment.md rendered as GitHub renders it, and read for its structure.

GitHub renders comments with cmark-gfm (tables, autolinks, strikethrough, the tag filter,
raw HTML such as `<details>` allowed). The rendered HTML is then checked as a maintainer
would read it: the headline is the first thing, every `<details>` block closes where it
should, and text a script wrote (a reason with `@octocat`, `</details>`, `<!--`, `#123`)
shows as text: it pings nobody, links no issue, closes nothing and hides nothing.

cmark-gfm comes from scripts/setup-system.sh (Debian package `cmark-gfm`); where it is
absent the same checks run on markdown-it's rendering (CommonMark + GFM tables), so the
structure is checked either way.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from test_report import fake_repro, save_record

from reprobox.report import build as report
from reprobox.report import markdown as md

HOSTILE = (
    "@octocat look </details> here <!-- the rest is hidden --> #123 GH-9 o/r#7 "
    "**bold** [link](https://evil.invalid) <img src=x onerror=alert(1)> | pipe ` tick"
)


def render(text: str) -> str:
    """HTML as GitHub makes it from `text` (cmark-gfm where installed)."""
    cmark = shutil.which("cmark-gfm")
    if cmark is None:
        renderer = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
        return renderer.render(text)
    extensions = ["table", "strikethrough", "autolink", "tagfilter", "tasklist"]
    argv = [cmark, "--unsafe", *(a for e in extensions for a in ("-e", e))]
    return subprocess.run(argv, input=text, capture_output=True, text=True, check=True).stdout


class Structure(HTMLParser):
    """Top-level blocks, <details> nesting, comments, and prose outside code."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.blocks: list[str] = []  # top-level tags, in order
        self.first_text = ""
        self.details_depth = 0
        self.opened = 0
        self.errors: list[str] = []
        self.comments: list[str] = []
        self.prose: list[str] = []  # text outside <code> / <pre>
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self.stack:
            self.blocks.append(tag)
        if tag == "details":
            self.details_depth += 1
            self.opened += 1
        if tag == "a":
            self.links.append(dict(attrs).get("href") or "")
        if tag == "img" and not (dict(attrs).get("src") or "").startswith("data:image/png"):
            self.errors.append(f"an <img> was rendered: {attrs}")
        if tag not in ("br", "hr", "img", "input"):
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self.details_depth -= 1
            if self.details_depth < 0:
                self.errors.append("a </details> closes a block that was never opened")
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if not self.first_text and data.strip():
            self.first_text = data.strip()
        if not any(t in ("code", "pre") for t in self.stack):
            self.prose.append(data)

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)


def parse(rendered: str) -> Structure:
    parser = Structure()
    parser.feed(rendered)
    parser.close()
    return parser


@pytest.fixture
def hostile_root(scratch_root: Path) -> Path:
    """A report whose script wrote hostile text into its reason, log and version strings."""
    fake_repro(scratch_root)
    broken = save_record(scratch_root, "broken", "reproduced", kl=0.2, reason=HOSTILE)
    broken.result["versions"]["trl"] = "0.7.1 </details> @octocat"
    broken.save()
    save_record(scratch_root, "fixed", "clean")
    crash = save_record(scratch_root, "fixed", None, packages={"trl": "0.7.2"}, reason=HOSTILE)
    (Path(crash.dir) / "launch.log").write_text(f"Traceback\n{HOSTILE}\n</details>\n```\n")
    return scratch_root


def test_comment_structure_as_github_renders_it(hostile_root: Path) -> None:
    made = report.write_report(hostile_root, "ppo", report.ReportOptions(collect_env=False))
    text = made.comment.read_text()
    tree = parse(render(text))
    # the headline is the first thing a maintainer reads
    assert tree.blocks[0] == "p" and tree.first_text.startswith("Reproduced")
    # every details block opened is closed, none closed early
    assert tree.errors == [] and tree.details_depth == 0
    assert tree.opened == text.count("<details><summary>") > 0
    # nothing hidden: the only comment is the report's own marker, and the text after the
    # planted `<!--` is visible
    assert tree.comments == [" reprobox-report: ppo "]
    prose = "".join(tree.prose)
    assert "the rest is hidden" in prose and "here" in prose
    # no ping, no issue reference, no planted link or image outside code
    assert not re.search(r"@[A-Za-z0-9]", prose), "a mention outside code"
    assert not re.search(r"(?<![\w/])#\d|GH-\d|\w/\w+#\d", prose), "an issue reference"
    assert all("evil.invalid" not in href for href in tree.links)
    # and the script's words are all there, literally, for a reader (the word joiners that
    # break mentions and autolinks are invisible)
    seen = prose.replace("\u2060", "")
    assert "@octocat look </details> here <!-- the rest is hidden --> #123 GH-9 o/r#7" in seen
    assert "**bold** [link](https://evil.invalid) <img src=x onerror=alert(1)> | pipe" in seen


def test_report_html_is_one_file_with_the_same_structure(hostile_root: Path) -> None:
    made = report.write_report(hostile_root, "ppo", report.ReportOptions(collect_env=False))
    page = made.html.read_text()
    tree = parse(page)
    assert tree.errors == [] and tree.details_depth == 0
    assert not re.search(r"@[A-Za-z0-9]", "".join(tree.prose))
    assert page.count("data:image/png;base64,") == len(made.plots) > 0


@pytest.mark.parametrize(
    "planted",
    ["@octocat", "</details>", "<!-- x", "#123", "`code`", "| a | b |", "1. item", "# head"],
)
def test_text_is_literal_when_rendered(planted: str) -> None:
    rendered = render(f"before {md.text(planted)} after\n")
    tree = parse(rendered)
    assert tree.blocks == ["p"] and not tree.comments and tree.errors == []
    shown = "".join(tree.prose).replace("\u2060", "")
    assert shown.strip() == f"before {planted} after"
    alone = parse(render(md.text(planted) + "\n"))
    assert alone.blocks == ["p"], planted  # no heading, list or table from it


def test_code_spans_and_fences_hold_anything() -> None:
    for planted in ["a`b", "``", "```\n</details>", "@octocat"]:
        rendered = render(md.code(planted) + "\n\n" + md.fence(planted) + "\n")
        tree = parse(rendered)
        assert tree.errors == [] and tree.blocks == ["p", "pre"]
        assert html.unescape(rendered).count(planted.split("\n")[0]) >= 1
