"""Papermill-compatible parameter parsing and rendering (pure, no I/O but ``-f``).

``-p NAME VALUE`` values are typed the way papermill types them: ``True``/``False``,
``None``, integers and floats become those; anything else stays a string.
``-r`` keeps the raw string, ``-y`` is a YAML mapping, ``-f`` a YAML file.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import keyword
import math
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .._errors import ParameterError


def resolve_type(value: str) -> Any:
    """Type a ``-p`` value as papermill does."""
    if value == "True":
        return True
    if value == "False":
        return False
    if value == "None":
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


MAX_PARAMETERS_FILE = 64 << 20  # a -f file's size at most


def _load_yaml_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        # an alias (*name) can make a few lines stand for gigabytes (the "billion laughs"):
        # parameters have no use for one, so none is taken
        if "*" in text and any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text)):
            raise ParameterError(f"{where} uses a YAML alias (*name); write the value out instead")
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParameterError(f"{where} is not valid YAML: {exc}") from exc
    except RecursionError:  # nested past the parser's stack
        raise ParameterError(f"{where} is not valid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParameterError(
            f"{where} must be a YAML mapping of parameter names to values, "
            f"not a {type(data).__name__}"
        )
    return {str(k): _plain(v) for k, v in data.items()}


def _plain(value: Any) -> Any:
    """A YAML value as JSON can hold it: dates, datetimes, binary and sets become their
    string form, which is what papermill writes into the notebook for them."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {
            k if isinstance(k, str | int | float | bool) or k is None else str(k): _plain(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def collect_parameters(
    *,
    paths: Mapping[str, str] | None = None,
    base64_yaml: Iterable[str] = (),
    files: Iterable[str] = (),
    yaml_strings: Iterable[str] = (),
    typed: Iterable[tuple[str, str]] = (),
    raw: Iterable[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Merge parameters in papermill's order: the injected paths, ``-b``, ``-f``, ``-y``,
    ``-p``, ``-r``."""
    params: dict[str, Any] = dict(paths or {})
    for encoded in base64_yaml:
        try:
            text = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParameterError(
                f"-b/--parameters_base64 {encoded!r} is not base64: {exc}"
            ) from exc
        params.update(_load_yaml_mapping(text, "the -b/--parameters_base64 value"))
    for name in files:
        path = Path(name)
        try:
            with path.open("rb") as fh:  # bounded: -f /dev/zero must not read forever
                data = fh.read(MAX_PARAMETERS_FILE + 1)
            if len(data) > MAX_PARAMETERS_FILE:
                raise ParameterError(
                    f"parameters file {name!r} (-f) is larger than "
                    f"{MAX_PARAMETERS_FILE >> 20} MiB: not a file of parameters"
                )
            text = data.decode("utf-8")
        except FileNotFoundError as exc:
            raise ParameterError(f"parameters file {name!r} (-f) does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ParameterError(f"cannot read parameters file {name!r} (-f): {exc}") from exc
        params.update(_load_yaml_mapping(text, f"parameters file {name!r}"))
    for text in yaml_strings:
        params.update(_load_yaml_mapping(text, "the -y/--parameters_yaml value"))
    for name, value in typed:
        params[name] = resolve_type(value)
    for name, value in raw:
        params[name] = value
    for name in params:
        check_name(name)
    return params


def check_name(name: str) -> None:
    """Refuse a parameter name that cannot be a Python variable."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ParameterError(
            f"parameter name {name!r} is not a valid Python variable name; "
            "use letters, digits and underscores, not starting with a digit"
        )


def _string(text: str) -> str:
    """A Python string literal written as papermill writes one: double quotes, with
    backslashes, control and non-ASCII characters escaped (so the cell diffs the same)."""
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


def render_literal(value: Any) -> str:
    """Python source for a parameter value (papermill's types: scalars, lists, dicts),
    spelled as papermill's Python translator spells it."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return f"float({str(value)!r})"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool | int):
        return repr(value)
    if isinstance(value, Mapping):
        items = ", ".join(f"{render_literal(k)}: {render_literal(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render_literal(v) for v in value) + "]"
    # Dates and other YAML scalars: their string form, as papermill does.
    return _string(str(value))


def render_python(params: Mapping[str, Any]) -> str:
    """The source of the ``injected-parameters`` cell for a Python kernel."""
    lines = ["# Parameters"]
    lines += [f"{name} = {render_literal(value)}" for name, value in params.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Parameter:
    """A parameter found in a notebook's ``parameters`` cell, as papermill's
    ``inspect_notebook`` reports one: ``inferred_type_name`` is the annotation (or a
    ``# type:`` comment), "None" when there is none; ``default`` is the value's source
    on one line; ``help`` the comment that ends the assignment."""

    name: str
    inferred_type_name: str
    default: str
    help: str

    def shown_type(self) -> str:
        """The type to show a person: the declared one, else the type of a literal
        default (``0.5`` is a float), else "Unknown type" as papermill says."""
        if self.inferred_type_name != "None":
            return self.inferred_type_name
        try:
            return type(ast.literal_eval(self.default)).__name__
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return "Unknown type"


_TYPE_COMMENT = re.compile(r"^type:\s*(?P<type>\S+)\s*(?P<help>.*)$")


def inspect_source(source: str) -> list[Parameter]:
    """The parameters a ``parameters`` cell assigns, in order: every top-level
    assignment of one name, annotated or not. Lines Python cannot parse (IPython
    magics, half-written code) are left out, not fatal."""
    lines = source.splitlines()
    tree = None
    for _ in range(len(lines) + 1):
        try:
            tree = ast.parse("\n".join(lines))
            break
        except SyntaxError as exc:
            bad = (exc.lineno or 0) - 1
            if not 0 <= bad < len(lines) or not lines[bad].strip():
                return []
            lines[bad] = ""  # drop the line and try again
    if tree is None:
        return []
    comments = _comments("\n".join(lines))
    found: list[Parameter] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, annotation = node.targets[0], None
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, annotation = node.target, node.annotation
        else:
            continue
        if not isinstance(target, ast.Name) or node.end_lineno is None:
            continue
        value = node.value
        assert value is not None
        help_text = comments.get(node.end_lineno, (0, ""))[1]
        type_name = "None"
        if annotation is not None:
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
                type_name = annotation.value
            else:
                type_name = ast.unparse(annotation)
        typed = _TYPE_COMMENT.match(help_text)
        if typed:
            if annotation is None:
                type_name = typed["type"]
            help_text = typed["help"]
        found.append(
            Parameter(
                name=target.id,
                inferred_type_name=type_name,
                default=_one_line(lines, value),
                help=help_text.strip(),
            )
        )
    return found


def _comments(source: str) -> dict[int, tuple[int, str]]:
    """Line number -> (column, text) of the comment that ends that line."""
    out: dict[int, tuple[int, str]] = {}
    with contextlib.suppress(tokenize.TokenError, SyntaxError):
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    return out


def _one_line(lines: list[str], node: ast.expr) -> str:
    """The source of an expression spread over lines, joined as it reads: each line
    stripped, comments dropped (papermill's spelling of a multi-line default)."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    chunk = lines[node.lineno - 1 : node.end_lineno]
    chunk[-1] = chunk[-1][: node.end_col_offset]
    chunk[0] = chunk[0][node.col_offset :]
    text = "\n".join(chunk)
    comments = _comments(text)
    parts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in comments:
            line = line[: comments[number][0]]
        parts.append(line.strip())
    return "".join(parts)
