"""The node-loss notebook: files and environment changes a notebook makes and reads back
later, each checked by behaviour at the end (``PATTERN name: value`` lines).

Killed during its gate cell and resumed on a *wiped node* (working directory, home,
temporary directory and pip target emptied: what a new pod sees), every pattern must
print what an uninterrupted run prints. Values never include the node's paths, so runs
in different folders compare. The notebook reads three environment variables: NL_WHEEL
(a wheel the test built, installed with ``%pip`` into the pip target the test gives as
PIP_TARGET), NL_URL (a loopback HTTP server's file) and NL_GATE (a file the test
creates after its kills).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from .nbwrite import write_notebook

CELLS = [
    # 0: the environment: a package installed from a wheel, imported later
    "%pip install -q --no-index --no-deps $NL_WHEEL",
    # 1: files through Python and C libraries
    """import os, sys, json, pickle, sqlite3, logging, shutil, tempfile, zipfile, tarfile
import subprocess, hashlib, urllib.request
import numpy as np
import pandas as pd
rng = np.random.default_rng(5)
arr = rng.normal(size=1000)
np.save('arr.npy', arr)
pd.DataFrame({'a': np.arange(50), 'b': np.arange(50) ** 2}).to_csv('table.csv', index=False)
pd.DataFrame({'c': np.arange(20) * 1.5}).to_parquet('table.parquet')
with open('model.pkl', 'wb') as fh:
    pickle.dump({'w': [1, 2, 3], 'bias': 0.5}, fh)
with open('config.json', 'w') as fh:
    json.dump({'lr': 0.1, 'layers': [4, 8]}, fh)
mm = np.memmap('mm.dat', dtype='float64', mode='w+', shape=(100,))
mm[:] = np.arange(100)
mm.flush()
del mm""",
    # 2: a module written by a cell, and a file its import reads
    "%%writefile helper.py\nimport os\nHERE = os.path.dirname(os.path.abspath(__file__))\n"
    "def twice(v):\n    return 2 * v\n",
    # 3: databases, logs and handles kept open across cells
    """db = sqlite3.connect('data.db')
db.execute('create table t(x integer)')
db.executemany('insert into t values (?)', [(i,) for i in range(10)])
db.commit()
side = sqlite3.connect('side.db')
side.execute('create table s(y)')
side.execute("insert into s values ('kept')")
side.commit()
side.close()
log = open('train.log', 'a')
log.write('epoch 1\\n')
log.flush()
logger = logging.getLogger('nl')
logger.setLevel(logging.INFO)
handler = logging.FileHandler('run.log')
handler.setFormatter(logging.Formatter('%(message)s'))
logger.addHandler(handler)
logger.info('started')""",
    # 4: the shell writes files too (a forked child: no Python saw them)
    "!echo from-the-shell > shell.txt\n!mkdir -p deep/er && printf 'nested' > deep/er/n.txt",
    # 5: a bash cell
    "%%bash\nseq 1 5 > seq.txt\nmkdir -p out\ncp seq.txt out/copy.txt",
    # 6: subprocesses, archives, a download, links and modes
    """subprocess.run(['sh', '-c', 'echo sub > sub.txt'], check=True)
os.makedirs('bundle', exist_ok=True)
for name in ('a', 'b'):
    with open(os.path.join('bundle', name + '.txt'), 'w') as fh:
        fh.write(name * 3)
shutil.make_archive('bundle', 'zip', 'bundle')
with tarfile.open('bundle.tar', 'w') as tf:
    tf.add('bundle/a.txt')
urllib.request.urlretrieve(os.environ['NL_URL'], 'download.txt')
with zipfile.ZipFile('bundle.zip') as zf:
    zf.extractall('unzipped')
with open('target.txt', 'w') as fh:
    fh.write('through a link')
os.symlink('target.txt', 'link.txt')
with open('run.sh', 'w') as fh:
    fh.write('#!/bin/sh\\necho script-ran\\n')
os.chmod('run.sh', 0o755)
with open('draft.txt', 'w') as fh:
    fh.write('final')
os.replace('draft.txt', 'final.txt')
shutil.copy('final.txt', 'copied.txt')
with open('gone.txt', 'w') as fh:
    fh.write('x')""",
    # 7: temporary files whose paths are kept, a cache under home, a plot
    """tmpdir = tempfile.mkdtemp(prefix='nl-')
with open(os.path.join(tmpdir, 'scratch.txt'), 'w') as fh:
    fh.write('scratch')
with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as fh:
    fh.write('named temp')
named = fh.name
cache = os.path.join(os.path.expanduser('~'), '.cache', 'nlapp')
os.makedirs(cache, exist_ok=True)
with open(os.path.join(cache, 'vocab.txt'), 'w') as fh:
    fh.write('alpha beta gamma')
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(2, 2))
ax.plot([1, 2, 3])
fig.savefig('plot.png', dpi=50)
plt.close(fig)""",
    # 8: a file deleted after it was made stays deleted
    "os.remove('gone.txt')",
    # 9: the gate: with NL_GATE set, wait for that file (killed in here)
    "import time\nwhile os.environ.get('NL_GATE') and not os.path.exists(os.environ['NL_GATE']):\n"
    "    time.sleep(0.01)",
    # 10: changes after the kill
    """log.write('epoch 2\\n')
log.flush()
logger.info('resumed or not')
db.execute('insert into t values (100)')
db.commit()""",
    # 11: the checks
    """import nlpkg
import helper


def show(name, value):
    print(f'PATTERN {name}: {value!r}')


def digest(path):
    with open(path, 'rb') as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:16]


show('pip wheel', nlpkg.VALUE)
show('np.save', float(np.load('arr.npy').sum()))
show('csv', int(pd.read_csv('table.csv').b.sum()))
show('parquet', float(pd.read_parquet('table.parquet').c.sum()))
show('pickle file', pickle.load(open('model.pkl', 'rb')))
show('json file', json.load(open('config.json')))
show('memmap', float(np.memmap('mm.dat', dtype='float64', mode='r', shape=(100,)).sum()))
show('writefile module', helper.twice(21))
show('module reads beside itself', os.path.basename(helper.HERE) == os.path.basename(os.getcwd()))
show('sqlite open handle', db.execute('select sum(x), count(*) from t').fetchone())
show('sqlite file', sqlite3.connect('side.db').execute('select y from s').fetchall())
show('log handle', open('train.log').read())
show('logging handler', open('run.log').read())
show('shell file', open('shell.txt').read())
show('shell nested', open('deep/er/n.txt').read())
show('bash cell', (open('seq.txt').read(), open('out/copy.txt').read()))
show('subprocess', open('sub.txt').read())
show('zip', sorted(os.listdir('unzipped')))
show('tar', tarfile.open('bundle.tar').getnames())
show('download', open('download.txt').read())
show('symlink', (os.path.islink('link.txt'), os.readlink('link.txt'), open('link.txt').read()))
show('mode', oct(os.stat('run.sh').st_mode & 0o777))
show('script runs', subprocess.run(['./run.sh'], capture_output=True, text=True).stdout)
show('rename', (os.path.exists('draft.txt'), open('final.txt').read()))
show('copy', open('copied.txt').read())
show('deleted stays deleted', os.path.exists('gone.txt'))
show('mkdtemp', open(os.path.join(tmpdir, 'scratch.txt')).read())
show('named temp', open(named).read())
show('home cache', open(os.path.join(cache, 'vocab.txt')).read())
show('savefig', os.path.getsize('plot.png') > 0 and open('plot.png', 'rb').read(4))""",
]

GATE = 9  # the cell that waits for NL_GATE
CHANGES = 10  # the cell after it, which changes files kept open


def write(path: Path) -> None:
    write_notebook(path, *CELLS)


def patterns(nb: dict[str, Any]) -> dict[str, str]:
    text = ""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            value = out.get("text") or ""
            text += "".join(value) if isinstance(value, list) else str(value)
            if out.get("output_type") == "error":
                text += f"ERROR {out.get('ename')}: {out.get('evalue')}\n"
    found = {m.group(1): m.group(2) for m in re.finditer(r"^PATTERN ([^:]+): (.*)$", text, re.M)}
    errors = re.findall(r"^ERROR .*$", text, re.M)
    if errors:
        found["(errors)"] = "; ".join(errors)
    return found


def build_wheel(where: Path) -> Path:
    """The pure-Python wheel ``nlpkg`` (VALUE = 7) that the notebook pip-installs, built
    offline into ``where/wheels``."""
    src = where / "nlpkg-src"
    (src / "nlpkg").mkdir(parents=True)
    (src / "nlpkg" / "__init__.py").write_text("VALUE = 7\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "nlpkg"\nversion = "0.1"\n'
    )
    wheels = where / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(wheels), str(src)],
        check=True,
    )  # fmt: skip
    (found,) = wheels.glob("nlpkg-*.whl")
    return found
