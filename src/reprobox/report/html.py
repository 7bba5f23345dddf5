"""`report.html`: the report as one file a browser opens, plots embedded.

A CI artifact or an e-mail attachment is opened as a single file: relative image links break
there, so each plot is inlined as a base64 `data:` URI. The markdown is rendered with
markdown-it (CommonMark plus GFM tables and strikethrough, raw HTML on for `<details>`): the
report's text is already escaped (`report.markdown`), so raw HTML in it is only its own.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)")

STYLE = """
body{font-family:-apple-system,'Segoe UI','Noto Sans',Helvetica,Arial,sans-serif;font-size:15px;
line-height:1.5;color:#1f2328;max-width:960px;margin:24px auto;padding:0 16px}
h1,h2{border-bottom:1px solid #d1d9e0;padding-bottom:.3em}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;
background:#f6f8fa;border-radius:6px}
code{padding:.2em .4em}pre{padding:12px;overflow:auto}pre code{padding:0}
table{border-collapse:collapse;display:block;overflow:auto;max-width:100%}
td,th{border:1px solid #d1d9e0;padding:4px 10px}tr:nth-child(2n){background:#f6f8fa}
details{margin:6px 0}summary{cursor:pointer}img{max-width:100%;height:auto}
"""


def embed_images(text: str, base: Path) -> str:
    """Replace `![alt](relative.png)` by the image's bytes as a data URI."""

    def inline(match: re.Match[str]) -> str:
        path = base / match["src"]
        if not path.is_file() or path.suffix.lower() != ".png":
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{match['alt']}](data:image/png;base64,{data})"

    return _IMAGE.sub(inline, text)


def render(markdown_text: str, base: Path, title: str) -> str:
    """A standalone HTML page of `markdown_text`, images under `base` embedded."""
    renderer = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    body = renderer.render(embed_images(markdown_text, base))
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n"
        f"<body>\n{body}</body></html>\n"
    )
