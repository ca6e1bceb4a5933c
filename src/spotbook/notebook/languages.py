"""How parameters are written for each kernel language papermill writes them for.

Pure: a parameter set in, the source of the ``injected-parameters`` cell out. Each
language is a table of its spellings (none, booleans, lists, maps, strings, how a name is
assigned and a comment written) rather than code, so adding one is adding a row. The
cells come out as papermill's translators write them, character for character, so a
notebook parameterised by either diffs the same.

spotbook *runs* Python notebooks only (it restores a Python kernel's state); the other
languages are for ``--prepare-only``, which writes the parameterised notebook without
running it.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ParameterError
from .parameters import render_python

_INT32 = range(-(2**31), 2**31)


def _c_string(text: str, quote_escape: str = '\\"') -> str:
    """A double-quoted string with backslashes, control and non-ASCII characters
    escaped the way Python's ``unicode_escape`` spells them."""
    return '"' + text.encode("unicode_escape").decode("ascii").replace('"', quote_escape) + '"'


def _matlab_chars(text: str) -> str:
    return "'" + text.encode("unicode_escape").decode("ascii").replace("'", "''") + "'"


@dataclass(frozen=True)
class Language:
    """One kernel language's spelling of papermill's parameter types."""

    name: str
    comment: str  # with {} for the text
    assign: str  # with {name} and {value}
    none: str | None  # None: the language has no spelling for it here
    true: str = "true"
    false: str = "false"
    string: Callable[[str], str] = _c_string
    list_: str | None = None  # with {} for the items, joined by list_sep
    list_sep: str = ", "
    map_: str | None = None  # with {} for the pairs, joined by map_sep
    pair: str = "{k} = {v}"
    map_sep: str = ", "
    long_suffix: str = ""  # for integers outside 32 bits
    float_: Callable[[float], str] = repr
    strip_underscores: bool = False  # names may not start with "_"
    map_render: Callable[[Language, Mapping[Any, Any]], str] | None = None

    def value(self, v: Any) -> str:
        if v is None:
            if self.none is None:
                raise ParameterError(f"{self.name} notebooks have no value for None here")
            return self.none
        if isinstance(v, str):
            return self.string(v)
        if isinstance(v, bool):
            return self.true if v else self.false
        if isinstance(v, int):
            return str(v) + ("" if v in _INT32 else self.long_suffix)
        if isinstance(v, float):
            return self.float_(v)
        if isinstance(v, Mapping):
            if self.map_render is not None:
                return self.map_render(self, v)
            if self.map_ is None:
                raise ParameterError(f"{self.name} notebooks take no dict parameters")
            pairs = (self.pair.format(k=self.string(str(k)), v=self.value(x)) for k, x in v.items())
            return self.map_.format(self.map_sep.join(pairs))
        if isinstance(v, list | tuple):
            if self.list_ is None:
                raise ParameterError(f"{self.name} notebooks take no list parameters")
            return self.list_.format(self.list_sep.join(self.value(x) for x in v))
        return f'"{v}"'  # dates and other YAML scalars: their text

    def cell(self, params: Mapping[str, Any]) -> str:
        lines = [self.comment.format("Parameters")]
        for name, v in params.items():
            if self.strip_underscores:
                name = name.lstrip("_")
            lines.append(self.assign.format(name=name, value=self.value(v)))
        return "\n".join(lines) + "\n"


def _matlab_map(lang: Language, v: Mapping[Any, Any]) -> str:
    keys = ", ".join(_matlab_chars(str(k)) for k in v)
    values = ", ".join(lang.value(x) for x in v.values())
    return f"containers.Map({{{keys}}}, {{{values}}})"


def _powershell_float(v: float) -> str:
    if math.isnan(v):
        return "[double]::NaN"
    if math.isinf(v):
        return "[double]::NegativeInfinity" if v < 0 else "[double]::PositiveInfinity"
    return repr(v)


R = Language(
    "R",
    comment="# {}",
    assign="{name} = {value}",
    none="NULL",
    true="TRUE",
    false="FALSE",
    list_="list({})",
    map_="list({})",
    strip_underscores=True,
)
SCALA = Language(
    "Scala",
    comment="// {}",
    assign="val {name} = {value}",
    none="None",
    list_="Seq({})",
    map_="Map({})",
    pair="{k} -> {v}",
    long_suffix="L",
)
JULIA = Language(
    "Julia",
    comment="# {}",
    assign="{name} = {value}",
    none="nothing",
    list_="[{}]",
    map_="Dict({})",
    pair="{k} => {v}",
)
MATLAB = Language(
    "MATLAB",
    comment="% {}",
    assign="{name} = {value};",
    none="NaN",
    string=lambda s: _c_string(s, '""'),
    list_="{{{}}}",
    map_render=_matlab_map,
)
CSHARP = Language(
    "C#",
    comment="// {}",
    assign="var {name} = {value};",
    none=None,
    list_="new [] {{ {} }}",
    map_="new Dictionary<string,Object>{{ {} }}",
    pair="{{ {k} , {v} }}",
    long_suffix="L",
)
FSHARP = Language(
    "F#",
    comment="(* {} *)",
    assign="let {name} = {value}",
    none="None",
    list_="[ {} ]",
    list_sep="; ",
    map_="[ {} ] |> Map.ofList",
    pair="({k}, {v} :> IComparable)",
    map_sep="; ",
    long_suffix="L",
)
POWERSHELL = Language(
    "PowerShell",
    comment="# {}",
    assign="${name} = {value}",
    none="$Null",
    true="$True",
    false="$False",
    string=lambda s: _c_string(s, '`"'),
    list_="@({})",
    map_="@{{{}}}",
    map_sep="\n ",
    float_=_powershell_float,
)
BASH = Language(
    "bash",
    comment="# {}",
    assign="{name}={value}",
    none="",
    string=shlex.quote,
    list_="({})",
    list_sep=" ",
)

# papermill's keys: a kernel name first, else the notebook's language
_BY_KEY: dict[str, Language | None] = {
    "python": None,  # Python: _parameters.render_python
    "pysparkkernel": None,
    "R": R,
    "sparkrkernel": R,
    "scala": SCALA,
    "sparkkernel": SCALA,
    "julia": JULIA,
    "matlab": MATLAB,
    ".net-csharp": CSHARP,
    ".net-fsharp": FSHARP,
    ".net-powershell": POWERSHELL,
    "bash": BASH,
}


def parameters_cell(kernel_name: str, language: str, params: Mapping[str, Any]) -> str:
    """The injected cell's source for a kernel (by name, else by language)."""
    for key in (kernel_name, language):
        if key in _BY_KEY:
            lang = _BY_KEY[key]
            return render_python(params) if lang is None else lang.cell(params)
    raise ParameterError(
        f"spotbook cannot write parameters for kernel {kernel_name!r} (language "
        f"{language!r}): it writes them for Python, R, Scala, Julia, MATLAB, C#, F#, "
        "PowerShell and bash, as papermill does; pass -k/-l to name one of those"
    )
