"""The fidelity notebook: many kinds of state in one notebook, each checked by behaviour.

Every pattern prints one ``PATTERN name: value`` line in the check cells at the end,
so one kill and resume checks all of them at once. ``PATTERNS`` maps each pattern to
the cells that make or change it: a divergence is *named* when the resume's fidelity
report mentions one of those cells or the pattern's variable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .nbwrite import write_notebook

CELLS = [
    # 0: imports, and a helper module the notebook imports later from a path it adds
    """import os, sys, re, random, logging, warnings, decimal, sqlite3, threading, queue
import itertools, socket, time
import numpy as np
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt
WORK = os.getcwd()
os.makedirs('fid_sub', exist_ok=True)
with open('fid_sub/fid_helper.py', 'w') as fh:
    fh.write('VALUE = 42\\n# line two\\n')""",
    # 1: process state
    """random.seed(11)
np.random.seed(12)
os.chdir('fid_sub')
sys.path.insert(0, os.getcwd())
os.environ['FID_SET'] = 'yes'
os.environ.pop('FID_DROP', None)
pd.set_option('display.max_rows', 6)
np.set_printoptions(precision=2, suppress=True)
np.seterr(divide='ignore')
warnings.simplefilter('ignore', UserWarning)
decimal.getcontext().prec = 5
sys.setrecursionlimit(2345)
logging.getLogger('fid').setLevel(logging.DEBUG)
logging.basicConfig(level=logging.WARNING, format='LOG %(name)s %(message)s', stream=sys.stdout)
plt.rcParams['lines.linewidth'] = 3.5
drawn = [random.random() for _ in range(3)]""",
    # 2: IPython state
    """%config InteractiveShell.ast_node_interactivity = 'last_expr_or_assign'
%precision 3
%load_ext autoreload""",
    # 3: handles and values
    """out = open('fid_out.txt', 'w')
out.write('one\\n')
src = open(os.path.join(WORK, 'fid_sub', 'fid_helper.py'))
header = src.readline()
app = open('fid_app.txt', 'a')
app.write('A\\n')
con = sqlite3.connect(':memory:')
con.execute('create table t(x)')
con.executemany('insert into t values (?)', [(1,), (2,)])
con.commit()
lock = threading.Lock()
lock.acquire()
ev = threading.Event()
ev.set()
cond = threading.Condition()
sem = threading.Semaphore(3)
sem.acquire()
q = queue.Queue()
q.put('q1')
q.put('q2')
counter = itertools.count(10)
next(counter)
cyc = itertools.cycle('xyz')
next(cyc)
pat = re.compile(r'(\\d+)-(\\d+)')
_X = 7
_tmp = [1, 2]""",
    # 4: what no pickler can capture: rebuilt by replaying its chain of cells
    """g = (i * i for i in range(100))
first = next(g)
sock = socket.socket()
state = {'s': socket.socket(), 'n': 0}""",
    # 5: the notebook's own classes, closures, aliasing, arrays, frames
    """class Acc:
    def __init__(self):
        self.items = []

    def add(self, x):
        self.items.append(x)
        return len(self.items)


acc = Acc()
acc.add('a')


def make_counter():
    n = 0

    def inc():
        nonlocal n
        n += 1
        return n

    return inc


tick = make_counter()
tick()
base = [1, 2, 3]
alias = base
holder = {'k': base, 'again': base}
arr = np.arange(12.0)
view = arr[2:6]
big = np.arange(1_000_000, dtype=np.float64)
df = pd.DataFrame({'a': range(30), 'b': [x * 0.5 for x in range(30)]})
wide = pd.DataFrame(np.arange(60).reshape(2, 30))
names = {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}
log = logging.getLogger('fid.var')""",
    # 6: an output for IPython's history
    "21 * 2",
    # 7: changes after the state was made
    """next(g)
out.write('two\\n')
app.write('B\\n')
state = {**state, 'n': state['n'] + 1}
acc.add('b')
tick()
con.execute('insert into t values (3)')
drawn.append(float(np.random.rand()))
huge = np.ones(20_000_000)""",
    # 8: a later cell to be killed in (its sleep is the notebook's work: under auto, 1.2 s of
    # compute makes a snapshot due; no test's kill waits on it)
    "time.sleep(1.2)",
    # 9: more changes
    """state = {**state, 'n': state['n'] + 1}
next(g)
got = q.get()""",
    # 10: a loop (a resume point inside the cell: issue 57); with FID_GATE set its second
    # iteration also waits for that file, so a test that kills the run N times can
    # release it only after the N-th kill (the run cannot end before), and a kill there
    # comes after the checkpoint of its first iteration where one is due
    "loop_draws = []\n"
    "for step in range(3):\n"
    "    loop_draws.append(float(np.random.rand()))\n"
    "    while step == 1 and os.environ.get('FID_GATE') and not os.path.exists(\n"
    "        os.environ['FID_GATE']\n"
    "    ):\n"
    "        time.sleep(0.01)\n"
    "time.sleep(1.2)",
    # 11: the checks
    """import fid_helper


def show(name, value):
    print(f'PATTERN {name}: {value!r}')


show('cwd', os.path.relpath(os.getcwd(), WORK))
show('sys.path', fid_helper.VALUE)
show('environ', (os.environ.get('FID_SET'), os.environ.get('FID_DROP')))
show('random', (drawn[:3], random.random()))
show('in-loop', (loop_draws, step))
show('numpy.random', (drawn[3], float(np.random.rand())))
show('pandas option', pd.get_option('display.max_rows'))
show('pandas import default', pd.get_option('display.max_columns'))
show('rcParams', plt.rcParams['lines.linewidth'])
show('backend', matplotlib.get_backend())
with warnings.catch_warnings(record=True) as caught:
    warnings.warn('ignored?', UserWarning)
show('warnings filter', len(caught))
show('numpy printoptions', str(np.array([1.23456, 2.0])))
show('numpy seterr', np.geterr()['divide'])
show('decimal context', str(decimal.Decimal(1) / decimal.Decimal(7)))
show('recursion limit', sys.getrecursionlimit())
show('logger level', logging.getLogger('fid').getEffectiveLevel())
logging.getLogger('fid').warning('handler from basicConfig')
show('extension', any('autoreload' in e for e in get_ipython().extension_manager.loaded))
show('generator', next(g))
out.write('three\\n')
out.flush()
show('file w', open('fid_out.txt').read())
show('file r', src.readline())
app.flush()
show('file a', open('fid_app.txt').read())
show('sqlite', con.execute('select sum(x), count(*) from t').fetchone())
show('lock', (lock.locked(), ev.is_set(), sem.acquire(blocking=False), type(cond).__name__))
show('queue', (got, q.qsize()))
show('itertools', (next(counter), next(cyc)))
show('regex', pat.match('12-34').groups())
show('socket', sock.family.name)
show('rebuilt from itself', state['n'])
show('underscore', (_X, _tmp))
show('class', (acc.add('c'), type(acc).__name__, isinstance(acc, Acc)))
show('closure', tick())
show('alias', (alias is base, holder['k'] is base, holder['again'] is holder['k']))
base.append(4)
show('alias mutation', holder['k'])
arr[3] = 99.0
show('view', view.tolist())
show('big array', float(big.sum()))
show('dataframe', float(df.b.sum()))
show('set order', list(names))
show('logger variable', (log.name, log.getEffectiveLevel()))
show("history", (_, [v for v in Out.values() if isinstance(v, int) and v == 42]))""",
    # 12: import-time pandas defaults, as rendered
    "wide",
    # 13: IPython display settings
    "display(list(range(10)))\n3.14159265",
]

# pattern -> (cells that make or change it, its variable names)
PATTERNS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "cwd": ((1,), ()),
    "sys.path": ((0, 1), ()),
    "environ": ((1,), ()),
    "random": ((1,), ("drawn",)),
    "numpy.random": ((1, 7, 10), ("drawn",)),
    "in-loop": ((10,), ("loop_draws", "step")),
    "pandas option": ((1,), ()),
    "pandas import default": ((0,), ()),
    "rcParams": ((1,), ()),
    "backend": ((0,), ()),
    "warnings filter": ((1,), ()),
    "numpy printoptions": ((1,), ()),
    "numpy seterr": ((1,), ()),
    "decimal context": ((1,), ()),
    "recursion limit": ((1,), ()),
    "logger level": ((1,), ()),
    "logging handler": ((1,), ()),
    "extension": ((2,), ()),
    "IPython config": ((2,), ()),
    "IPython display settings": ((2,), ()),
    "file w": ((3, 7), ("out",)),
    "file r": ((3,), ("src",)),
    "file a": ((3, 7), ("app",)),
    "sqlite": ((3, 7), ("con",)),
    "lock": ((3,), ("lock", "ev", "sem", "cond")),
    "queue": ((3, 9), ("q",)),
    "itertools": ((3,), ("counter", "cyc")),
    "regex": ((3,), ("pat",)),
    "underscore": ((3,), ("_X", "_tmp")),
    "generator": ((4, 7, 9), ("g",)),
    "socket": ((4,), ("sock",)),
    "rebuilt from itself": ((4, 7, 9), ("state",)),
    "class": ((5, 7), ("acc",)),
    "closure": ((5, 7), ("tick",)),
    "alias": ((5,), ("alias", "base", "holder")),
    "alias mutation": ((5,), ("base", "holder")),
    "view": ((5,), ("view", "arr")),
    "big array": ((5,), ("big",)),
    "dataframe": ((5,), ("df",)),
    "set order": ((5,), ("names",)),
    "logger variable": ((1, 5), ("log",)),
    "history": ((6,), ()),
    "pandas rendering": ((0,), ("wide",)),
}
# outputs checked as rendered (cell index -> pattern name)
RENDERED = {12: "pandas rendering", 13: "IPython display settings", 9: "IPython config"}
CHECKS = 11  # the cell that prints the PATTERN lines
KILL_CELLS = {"after-change": 5, "later-cell": 9}  # kill once this many cells committed
GATE = 10  # the cell that waits for FID_GATE: records of the cells before it commit, not it
LOOP = 10  # the cell whose loop is a resume point (its first iteration never waits)


def write(path: Path) -> None:
    write_notebook(path, *CELLS)


def _text(output: dict[str, Any]) -> str:
    text = output.get("text") or (output.get("data") or {}).get("text/plain") or ""
    return "".join(text) if isinstance(text, list) else str(text)


def patterns(nb: dict[str, Any]) -> dict[str, str]:
    """Each pattern's value in an output notebook, and each rendered check's output."""
    found: dict[str, str] = {}
    cells = nb["cells"]
    for index, cell in enumerate(cells):
        outputs = cell.get("outputs", [])
        text = "".join(_text(o) for o in outputs)
        for m in re.finditer(r"^PATTERN ([^:]+): (.*)$", text, re.M):
            found[m.group(1)] = m.group(2)
        if index == CHECKS:
            found["logging handler"] = repr("LOG fid handler from basicConfig" in text)
        if index in RENDERED:
            rendered = [o for o in outputs if "PATTERN" not in _text(o)]
            found[RENDERED[index]] = repr(rendered)
    return found


def named(pattern: str, fidelity: dict[str, Any]) -> bool:
    """Whether the fidelity report names what a divergent pattern depends on."""
    cells, variables = PATTERNS.get(pattern, ((), ()))
    said = " ".join(fidelity.get("may_differ") or [])
    return any(f"cell {c} " in said for c in cells) or any(f"'{v}'" in said for v in variables)
