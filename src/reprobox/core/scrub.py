"""Keep secrets and personal paths out of everything a report writes.

A report is pasted into a public issue, so every string it takes from the machine (commands,
logs, results, collect_env output) passes through `Scrubber`: values of environment variables
whose names look secret, tokens recognised by their shape, passwords in URLs and in secret
looking flags, and home directories (replaced with `~`).

It lives in `core` because records and run logs are scrubbed as they are written, by the
same rules a report uses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"

# Names of environment variables (and flags) whose values are treated as secrets: a strong
# word anywhere (not TOKENIZERS or MAX_NEW_TOKENS), or a weak one as a whole name part.
_STRONG_NAME = re.compile(r"TOKEN(?!IZ|S)|SECRET|PASSW(?:OR)?D|CREDENTIAL|APIKEY", re.IGNORECASE)
_WEAK_PARTS = {"KEY", "PASS", "PASSPHRASE", "AUTH", "COOKIE", "PRIVATE"}
# Values too short or too common to replace wherever they occur in text.
MIN_SECRET_LEN = 6
_HARMLESS = {"true", "false", "none", "null", "yes", "no", "unset", "default"}

# Tokens recognised by their shape, wherever they appear.
_TOKEN_SHAPES = [
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub classic / OAuth / app tokens
    r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained
    r"glpat-[A-Za-z0-9_-]{16,}",  # GitLab
    r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI-style API keys (sk-..., sk-proj-...)
    r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])",  # AWS access key ids
    r"xox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"AIza[0-9A-Za-z_-]{35}\b",  # Google API keys
    r"pypi-AgE[A-Za-z0-9_-]{16,}",  # PyPI and TestPyPI upload tokens (macaroons)
    r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # JWTs: {"alg"..}.{..}.sig
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]+",  # webhooks
]
# A private key block, BEGIN to its END (`_hide_private_keys`: one lazy pattern was quadratic
# in the number of BEGIN lines with no END after them).
_KEY_BEGIN = re.compile(r"(?<![A-Za-z0-9])-----BEGIN [A-Z ]*PRIVATE KEY-----")
_KEY_END = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")
# No \b before a prefix: `_` is a word character, and `kl_rank0_hf_...` must match too.
_TOKENS = re.compile("(?<![A-Za-z0-9])(?:" + "|".join(_TOKEN_SHAPES) + ")", re.DOTALL)
# `Bearer X` anywhere; `Authorization: <scheme> X` (Basic, token, ...) in headers.
_BEARER = re.compile(
    r"\b(Bearer\s+|Authorization:\s*(?:[A-Za-z]+\s+)?)[A-Za-z0-9._~+/=-]{8,}", re.I
)
# Every pattern that may start at any character of a run (a scheme, a name, a flag) starts
# only where that run starts, skips its first characters that cannot begin one, and then
# never gives back what it matched (`*+`): a backtracking match tried at every character
# of a long unbroken word (a base64 blob, a hex dump, a tensor on one line) was quadratic
# (2.3 s for one 8 KiB line; `nox -s bench -- scrub`). The match found is the one the plain
# pattern found first: its end is fixed by the run's end, whichever character it starts at.
_URL_USERINFO = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<pre>(?:(?!\b[a-zA-Z])[a-zA-Z0-9+.-])*+)"
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*+://)[^/\s@'\"]++@"
)
# `password X` / `passwd X` as prose and config files give it (not `password is required`).
_PASSWORD_WORD = re.compile(
    r"(?i)\b(pass(?:word|wd|phrase)\s+)"
    r"(?!(?:is|was|for|of|the|to|and|or|not|must|required|prompt|from|in|on|with|file)\b)"
    r"[^\s'\"]+"
)
# mysql's `-pSECRET` (the value glued to -p): anywhere on a mysql-family line, and elsewhere
# when the glued value looks like a credential (not `-p22`, `-p8080:80`, `mkdir -pv`) and is
# a whole shell word with punctuation in it, never code: `-pooled["mean"]`, `-pooled.mean`
# or `-p_value_2` in a repro's script is an expression, and redacting it would break the
# script a maintainer runs.
# (`_hide_mysql_p`: a mysql word, then on its line the first `-p` with a value glued to it;
# one lazy pattern was quadratic in the mysql words of a line.)
_MYSQL_WORD = re.compile(r"(?i)\b(?:mysql\w*|mariadb\w*)\b")
_MYSQL_P = re.compile(r"(?i)(?<!\S)-p(?P<value>[^\s'\"]+)")
_GLUED_P = re.compile(
    r"(?<!\S)(-p)(?=[^\s'\"]{6,})(?=\S*[A-Za-z])(?=\S*[^\w\s])"
    r"(?![^\s'\"]*(?:[()\[\]{}]|\.[A-Za-z_]))[^\s'\"]+(?=$|\s|['\"](?:$|\s))"
)
# Azure connection strings (AccountKey=...;) and SAS signatures (...&sig=...).
_AZURE = re.compile(
    r"\b((?:AccountKey|SharedAccessKey|SharedAccessSignature)=|[?&]sig=)[^;&\s'\"]+", re.I
)
# Credentials that command lines and files give after a space, not an `=`: netrc
# (`machine h login u password X`), `curl -u user:pass` (not `-u uid:gid`), `sshpass -p X`.
_NETRC = re.compile(r"\b((?:login|machine|default)\s+\S+\s+(?:\S+\s+\S+\s+)??password\s+)\S+")
_USER_PASS = re.compile(
    r"(?<!\S)((?:-u|--user|--proxy-user|-U)(?:\s+|=)['\"]?[^\s:'\"]+:)(?!\d+\b)[^\s'\"]+"
)
_SSHPASS = re.compile(r"\b(sshpass\s+(?:-[A-Za-oq-z]\S*\s+)*-p\s*)\S+")
# "name": "a value with spaces" (JSON, YAML, Python reprs), which _ASSIGN stops short of.
_QUOTED = re.compile(
    r"(?P<q>[\"'])(?P<name>[A-Za-z_][\w.-]*)(?P=q)(?P<sep>\s*:\s*)"
    r"(?P<vq>[\"'])(?P<value>(?:\\.|(?!(?P=vq)).)+)(?P=vq)"
)
# Names whose every value is a secret (a password may be a plain word or several).
_ALWAYS_SECRET = re.compile(r"PASSW(?:OR)?D|PASSPHRASE|SECRET|CREDENTIAL", re.IGNORECASE)
# NAME=value, --name=value, "name": "value", name: value; and `--name value` on a command line.
_ASSIGN = re.compile(
    r"(?<![\w.-])(?P<pre>(?:[^\W_A-Za-z]|[.-])*+)(?P<name>[A-Za-z_][\w.-]*+)"
    r"(?P<sep>[\"']?\s*+[=:]\s*+[\"']?)(?P<value>[^\s'\",;&()\[\]{}]++)"
)
_FLAG_VALUE = re.compile(
    r"(?<![\w-])(?P<pre>(?:\w++|-(?!-?[A-Za-z]))*+)(?P<name>--?[A-Za-z][\w-]*+)"
    r"(?P<sep>\s++)(?P<value>[^\s'\"-][^\s'\"]*+)"
)
_CODE_LIKE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")  # a dotted name: attribute access
_HOME_DIRS = re.compile(r"(?<![\w./-])(?:/home/[^/\s'\"]+|/Users/[^/\s'\"]+|/root)(?=/|\b|$)")
# What every match of a pattern holds (lower case for a pattern that ignores case): a text
# without any of them is not searched (`_may_match`). tests/test_scrub.py checks each
# against every match its cases give.
NEEDLES: dict[re.Pattern[str], tuple[str, ...]] = {
    _BEARER: ("bearer", "authorization:"),
    _URL_USERINFO: ("://",),
    _AZURE: ("accountkey=", "sharedaccesskey=", "sharedaccesssignature=", "sig="),
    _NETRC: ("password",),
    _USER_PASS: ("-u", "-U"),
    _SSHPASS: ("sshpass",),
    _PASSWORD_WORD: ("pass",),
    _MYSQL_WORD: ("mysql", "mariadb"),
    _GLUED_P: ("-p",),
    _QUOTED: ('"', "'"),
    _ASSIGN: ("=", ":"),
    _FLAG_VALUE: ("-",),
    _HOME_DIRS: ("/home/", "/Users/", "/root"),
}


def hide_url_credentials(text: str) -> str:
    """`text` with the `user:password@` of every URL in it replaced: the one rule for a URL
    that is shown, stored or turned into a folder name (`git+https://u:p@host/x@ref`)."""
    if not _may_match(_URL_USERINFO, text):
        return text
    return _URL_USERINFO.sub(_hide_userinfo, text)


def _may_match(shape: re.Pattern[str], text: str) -> bool:
    """False only when `text` lacks every string a match of `shape` must hold (NEEDLES): a
    pass of a pattern costs about 0.03 s per MiB, and a log rarely holds `sshpass`. A shape
    that ignores case is looked for in the lowered text, which is exact for ASCII only: other
    text always gets the pass (Unicode case rules pair `İ` with `i`, `K` with `k`)."""
    needles = NEEDLES.get(shape)
    if needles is None:
        return True
    if shape.flags & re.IGNORECASE:
        if not text.isascii():
            return True
        text = text.lower()
    return any(needle in text for needle in needles)


def looks_secret(name: str) -> bool:
    """Whether an environment variable or flag name suggests a credential (`AccountKey` and
    `apiKey` too: camelCase words count as parts)."""
    if _STRONG_NAME.search(name):
        return True
    parts = re.split(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])", name)
    return any(part.upper() in _WEAK_PARTS for part in parts)


def _worth_hiding(value: str) -> bool:
    """A value that looks like a credential: long enough, letters and digits, and not code
    (`pad_token = tokenizer.eos_token`, `key = hashlib.sha256(...)` stay readable)."""
    if len(value) < MIN_SECRET_LEN or value.lower() in _HARMLESS or value == REDACTED:
        return False
    if _CODE_LIKE.match(value):
        return False
    return any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


def _hide_quoted(match: re.Match[str]) -> str:
    name, value = match["name"], match["value"]
    if not looks_secret(name) or value.lower() in _HARMLESS or value == REDACTED:
        return match.group(0)
    if _ALWAYS_SECRET.search(name) or _worth_hiding(value):
        quote = match["vq"]
        return f"{match['q']}{name}{match['q']}{match['sep']}{quote}{REDACTED}{quote}"
    return match.group(0)


def _hide_assignment(match: re.Match[str]) -> str:
    if looks_secret(match["name"]) and _worth_hiding(match["value"]):
        return f"{match['pre']}{match['name']}{match['sep']}{REDACTED}"
    return match.group(0)


def _keep_first(match: re.Match[str]) -> str:
    return f"{match.group(1)}{REDACTED}"


def _hide_userinfo(match: re.Match[str]) -> str:
    return f"{match['pre']}{match['scheme']}{REDACTED}@"


def _hide_private_keys(text: str) -> str:
    """Each private key block (BEGIN to the first END after it) replaced whole."""
    if "PRIVATE KEY-----" not in text:
        return text
    out: list[str] = []
    pos = 0
    while (begin := _KEY_BEGIN.search(text, pos)) is not None:
        end = _KEY_END.search(text, begin.end())
        if end is None:
            break  # no END after this BEGIN: none after a later one either
        out += [text[pos : begin.start()], REDACTED]
        pos = end.end()
    return "".join(out) + text[pos:]


def _hide_mysql_p(text: str) -> str:
    """mysql's `-pSECRET` (the value glued to -p) after a mysql-family word on its line: the
    first such `-p` after the word, as one `mysql ... -pX` command line has it."""
    if not _may_match(_MYSQL_WORD, text):
        return text
    out: list[str] = []
    kept = pos = 0  # text[:kept] is in `out`; the next mysql word is looked for from `pos`
    while (word := _MYSQL_WORD.search(text, pos)) is not None:
        line_end = text.find("\n", word.end())
        line_end = len(text) if line_end < 0 else line_end
        flag = _MYSQL_P.search(text, word.end(), line_end)
        if flag is None:
            pos = line_end  # no -p on this line after this word: none after a later one
            continue
        out += [text[kept : flag.start("value")], REDACTED]
        kept = pos = flag.end()
    return "".join(out) + text[kept:]


# The shapes `Scrubber.text` replaces after the tokens, in order.
_SHAPES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (_BEARER, _keep_first),
    (_URL_USERINFO, _hide_userinfo),
    *((shape, _keep_first) for shape in (_AZURE, _NETRC, _USER_PASS, _SSHPASS)),
    (_PASSWORD_WORD, _keep_first),
)
# ... then mysql's `-pX` (`_hide_mysql_p`), then these.
_SHAPES_AFTER: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (_GLUED_P, _keep_first),
    (_QUOTED, _hide_quoted),
    (_ASSIGN, _hide_assignment),
    (_FLAG_VALUE, _hide_assignment),
)


class Scrubber:
    """Replaces secrets and home paths in text; built once from an environment."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        home: str | None = None,
        *,
        paths: bool = True,
    ) -> None:
        environ = os.environ if environ is None else environ
        values = {
            value
            for name, value in environ.items()
            if looks_secret(name)
            and len(value) >= MIN_SECRET_LEN
            and value.lower() not in _HARMLESS
        }
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted(values, key=len, reverse=True)
        home = home if home is not None else environ.get("HOME") or str(Path.home())
        self._home = home.rstrip("/") if home and home.rstrip("/") else ""
        self._paths = paths  # False: home paths stay (a record's `dir` must still resolve)

    def text(self, text: str) -> str:
        """`text` with every secret replaced by [REDACTED] and home paths by `~`."""
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        text = _TOKENS.sub(REDACTED, _hide_private_keys(text))
        for shape, replace in _SHAPES:
            if _may_match(shape, text):
                text = shape.sub(replace, text)
        text = _hide_mysql_p(text)
        for shape, replace in _SHAPES_AFTER:
            if _may_match(shape, text):
                text = shape.sub(replace, text)
        if not self._paths:
            return text
        if self._home and self._home not in ("/", "/root") and self._home in text:
            text = re.sub(rf"(?<![\w./-]){re.escape(self._home)}(?=/|\b|$)", "~", text)
        return _HOME_DIRS.sub("~", text) if _may_match(_HOME_DIRS, text) else text

    def argv(self, argv: list[str]) -> list[str]:
        """A command line with secrets removed, including the value after a secret flag
        (`--hf-token VALUE`), which text scrubbing of single words cannot see."""
        cleaned: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                cleaned.append(REDACTED)
                hide_next = False
                continue
            if arg.startswith("-") and "=" not in arg and looks_secret(arg.lstrip("-")):
                hide_next = True
            cleaned.append(self.text(arg))
        return cleaned

    def data(self, value: Any) -> Any:
        """A JSON-like structure with every string (keys included) scrubbed."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(k): self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            if value and all(isinstance(v, str) for v in value):
                return self.argv(list(value))  # maybe a command line: `--token VALUE` pairs
            return [self.data(v) for v in value]
        return value


def secrets_out(value: Any) -> Any:
    """`value` (text or JSON-like data) without the secrets of this process's environment
    or any secret-shaped token, paths kept: for what a run stores and prints (a record's
    reason and result, the terminal's lines), which must resolve on this machine."""
    return Scrubber(paths=False).data(value)
