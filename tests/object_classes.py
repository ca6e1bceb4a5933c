"""The object-class table: objects of 150+ classes, each made in a notebook cell,
killed after a snapshot, resumed on a wiped node, and checked by behaviour (not by repr).

``python -m tests.object_classes`` prints the table as Markdown (what
docs/object-classes.md holds); tests/test_object_classes.py asserts it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .conftest import node_lost
from .nbwrite import write_notebook

# library -> [(class shown, code that makes o, expression that exercises o)]
# Each behaviour is evaluated after the resume, in a later cell.
ENTRIES: dict[str, list[tuple[str, str, str]]] = {
    "stdlib": [
        ("int", "o = 2 ** 100", "o + 1"),
        ("float", "o = 1.5", "o * 3"),
        ("complex", "o = 2 + 3j", "o * 1j"),
        ("str", "o = 'spotbook'", "o.upper()"),
        ("bytes", "o = b'ab' * 40_000", "(len(o), o[-3:])"),
        ("bytearray", "o = bytearray(b'ab')", "(o.extend(b'c'), bytes(o))[1]"),
        ("list", "o = [3, 1, 2]", "sorted(o)"),
        ("tuple", "o = (1, 'a')", "o[::-1]"),
        ("dict", "o = {'b': 1, 'a': 2}", "list(o.items())"),
        ("set", "o = {3, 1, 2}", "sorted(o | {4})"),
        ("frozenset", "o = frozenset('abc')", "sorted(o)"),
        ("range", "o = range(2, 20, 3)", "list(o)"),
        ("slice", "o = slice(1, 5, 2)", "list(range(10))[o]"),
        (
            "OrderedDict",
            "o = collections.OrderedDict(a=1, b=2)",
            "(o.move_to_end('a'), list(o))[1]",
        ),
        ("defaultdict", "o = collections.defaultdict(list)", "(o['x'].append(1), dict(o))[1]"),
        ("Counter", "o = collections.Counter('abracadabra')", "o.most_common(2)"),
        ("deque", "o = collections.deque([1, 2, 3], maxlen=3)", "(o.append(4), list(o))[1]"),
        (
            "namedtuple (notebook class)",
            "Pt = collections.namedtuple('Pt', 'x y')\no = Pt(1, 2)",
            "(o.x + o.y, type(o).__name__)",
        ),
        (
            "dataclass (notebook class)",
            "@dataclasses.dataclass\nclass DC:\n    a: int\n    def twice(self):\n        return self.a * 2\no = DC(4)",
            "(o.twice(), dataclasses.asdict(o))",
        ),
        (
            "Enum (notebook class)",
            "class Color(enum.Enum):\n    RED = 1\no = Color.RED",
            "(o is Color.RED, o.name)",
        ),
        (
            "datetime",
            "o = datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)",
            "o.isoformat()",
        ),
        ("date", "o = datetime.date(2026, 2, 3)", "o.weekday()"),
        ("timedelta", "o = datetime.timedelta(hours=5)", "o.total_seconds()"),
        ("timezone", "o = datetime.timezone(datetime.timedelta(hours=2))", "str(o)"),
        ("Decimal", "o = decimal.Decimal('1.10')", "str(o * 3)"),
        ("Fraction", "o = fractions.Fraction(1, 3)", "str(o + 1)"),
        ("UUID", "o = uuid.UUID(int=12345)", "str(o)"),
        ("Path", "o = pathlib.Path('a/b.txt')", "(o.suffix, o.parent.name)"),
        ("re.Pattern", "o = re.compile(r'(a+)b')", "o.match('aab').group(1)"),
        ("re.Match", "o = re.match(r'(a+)b', 'aab')", "o.group(1)"),
        ("functools.partial", "o = functools.partial(int, base=2)", "o('101')"),
        ("lambda", "o = lambda x: x * 7", "o(6)"),
        (
            "closure",
            "def mk():\n    n = [0]\n    def inc():\n        n[0] += 1\n        return n[0]\n    return inc\no = mk()\no()",
            "o()",
        ),
        ("generator", "o = (i * i for i in range(10))\nnext(o)", "next(o)"),
        ("itertools.count", "o = itertools.count(5)\nnext(o)", "next(o)"),
        ("itertools.chain", "o = itertools.chain('ab', 'cd')\nnext(o)", "list(o)"),
        ("list_iterator", "o = iter([1, 2, 3])\nnext(o)", "list(o)"),
        ("map", "o = map(str, [1, 2, 3])\nnext(o)", "list(o)"),
        ("zip", "o = zip('ab', [1, 2])", "list(o)"),
        ("enumerate", "o = enumerate('xyz')\nnext(o)", "list(o)"),
        ("StringIO", "o = io.StringIO()\no.write('hello')", "(o.write('!'), o.getvalue())[1]"),
        ("BytesIO", "o = io.BytesIO(b'abc')\no.read(1)", "o.read()"),
        ("file (text, read)", "o = open('obj_read.txt')\no.readline()", "o.readline()"),
        (
            "file (binary, write)",
            "o = open('obj_write.bin', 'wb')\no.write(b'12')",
            "(o.write(b'3'), o.flush(), open('obj_write.bin', 'rb').read())[2]",
        ),
        ("Lock", "o = threading.Lock()\no.acquire()", "o.locked()"),
        ("RLock", "o = threading.RLock()", "o.acquire(blocking=False)"),
        ("Event", "o = threading.Event()\no.set()", "o.is_set()"),
        ("Condition", "o = threading.Condition()", "o.acquire(blocking=False)"),
        (
            "Semaphore",
            "o = threading.Semaphore(2)\no.acquire()",
            "(o.acquire(blocking=False), o.acquire(blocking=False))",
        ),
        ("queue.Queue", "o = queue.Queue()\no.put(1)\no.put(2)", "(o.get(), o.qsize())"),
        (
            "sqlite3 (memory)",
            "o = sqlite3.connect(':memory:')\no.execute('create table t(x)')\no.execute('insert into t values (5)')",
            "o.execute('select sum(x) from t').fetchone()",
        ),
        (
            "sqlite3 (file)",
            "o = sqlite3.connect('obj.db')\no.execute('create table if not exists t(x)')\no.execute('delete from t')\no.execute('insert into t values (6)')\no.commit()",
            "o.execute('select sum(x) from t').fetchone()",
        ),
        (
            "sqlite3.Cursor",
            "o = sqlite3.connect(':memory:').cursor()\no.execute('select 7')",
            "o.fetchone()",
        ),
        (
            "Logger",
            "o = logging.getLogger('objects')\no.setLevel(logging.ERROR)",
            "(o.name, o.getEffectiveLevel())",
        ),
        ("socket", "o = socket.socket()", "o.family.name"),
        ("array.array", "o = array.array('i', [1, 2])", "(o.append(3), o.tolist())[1]"),
        ("struct.Struct", "o = struct.Struct('<ih')", "o.pack(1, 2)"),
        (
            "weakref.ref",
            "class W:\n    pass\nw_target = W()\no = weakref.ref(w_target)",
            "o() is w_target",
        ),
        ("SimpleNamespace", "o = types.SimpleNamespace(a=1)", "vars(o)"),
        (
            "memoryview",
            "mv_base = bytearray(b'abcd')\no = memoryview(mv_base)",
            "(mv_base.__setitem__(0, 122), bytes(o))[1]",
        ),
        ("hashlib", "o = hashlib.sha256(b'a')", "(o.update(b'b'), o.hexdigest()[:16])[1]"),
        ("random.Random", "o = random.Random(3)\no.random()", "o.random()"),
        (
            "zlib compressobj",
            "o = zlib.compressobj()\nz_head = o.compress(b'x' * 100)",
            "len(z_head + o.flush())",
        ),
        (
            "csv.writer",
            "csv_buf = io.StringIO()\no = csv.writer(csv_buf)\no.writerow([1, 2])",
            "(o.writerow([3, 4]), csv_buf.getvalue())[1]",
        ),
        ("string.Template", "o = string.Template('$a-$b')", "o.substitute(a=1, b=2)"),
        ("ipaddress", "o = ipaddress.ip_network('10.0.0.0/30')", "[str(h) for h in o.hosts()]"),
        ("EmailMessage", "o = email.message.EmailMessage()\no['Subject'] = 'hi'", "o['Subject']"),
        (
            "ElementTree.Element",
            "o = xml.etree.ElementTree.Element('a', x='1')",
            "xml.etree.ElementTree.tostring(o)",
        ),
        (
            "class with __slots__",
            "class Sl:\n    __slots__ = ('a',)\n    def __init__(self):\n        self.a = 3\no = Sl()",
            "o.a",
        ),
        ("recursive list", "o = [1]\no.append(o)", "o[1][1][0] + len(o)"),
        ("module", "o = json", "o.dumps([1])"),
    ],
    "numpy": [
        ("ndarray", "o = np.arange(6.0).reshape(2, 3)", "o.sum(axis=0).tolist()"),
        (
            "structured ndarray",
            "o = np.zeros(2, dtype=[('a', 'i4'), ('b', 'f8')])\no['a'] = [1, 2]",
            "o['a'].tolist()",
        ),
        ("MaskedArray", "o = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])", "float(o.sum())"),
        ("Generator", "o = np.random.default_rng(5)\no.random()", "float(o.random())"),
        ("RandomState", "o = np.random.RandomState(6)\no.rand()", "float(o.rand())"),
        (
            "datetime64 array",
            "o = np.array(['2026-01-01', '2026-03-01'], dtype='datetime64[D]')",
            "str(o[1] - o[0])",
        ),
        ("float32 scalar", "o = np.float32(1.25)", "(float(o * 2), str(o.dtype))"),
        (
            "memmap",
            "o = np.memmap('obj.mm', dtype='f8', mode='w+', shape=(3,))\no[:] = [1, 2, 3]",
            "(type(o).__name__, float(o.sum()))",
        ),
    ],
    "pandas": [
        (
            "DataFrame",
            "o = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
            "o.assign(c=o.a * 2).to_dict('list')",
        ),
        ("Series", "o = pd.Series([1.5, 2.5], index=['p', 'q'])", "o.cumsum().to_dict()"),
        (
            "Categorical",
            "o = pd.Categorical(['a', 'b', 'a'], categories=['b', 'a'])",
            "o.codes.tolist()",
        ),
        ("MultiIndex", "o = pd.MultiIndex.from_product([[1, 2], ['a']])", "o.tolist()"),
        (
            "DatetimeIndex (tz)",
            "o = pd.date_range('2026-01-01', periods=2, tz='UTC')",
            "[str(t) for t in o]",
        ),
        ("Timestamp", "o = pd.Timestamp('2026-05-06 07:08')", "str(o + pd.Timedelta(hours=1))"),
        ("Interval", "o = pd.Interval(0, 5)", "2 in o"),
        (
            "GroupBy",
            "o = pd.DataFrame({'k': [1, 1, 2], 'v': [1, 2, 3]}).groupby('k')",
            "o.v.sum().to_dict()",
        ),
    ],
    "scipy": [
        ("csr_matrix", "o = scipy.sparse.csr_matrix(np.eye(3))", "float(o.sum())"),
        ("frozen distribution", "o = scipy.stats.norm(1, 2)", "round(float(o.cdf(1)), 6)"),
        ("interp1d", "o = scipy.interpolate.interp1d([0, 1], [0, 10])", "float(o(0.25))"),
        ("KDTree", "o = scipy.spatial.KDTree([[0, 0], [1, 1]])", "int(o.query([0.9, 0.9])[1])"),
        (
            "OptimizeResult",
            "o = scipy.optimize.minimize_scalar(lambda x: (x - 2) ** 2)",
            "round(float(o.x), 4)",
        ),
        (
            "csc_matrix",
            "o = scipy.sparse.csc_matrix([[1, 0], [0, 2]])",
            "(o @ o).toarray().tolist()",
        ),
        (
            "coo_matrix",
            "o = scipy.sparse.coo_matrix(([5, 6], ([0, 1], [1, 0])), shape=(2, 2))",
            "o.tocsr().toarray().tolist()",
        ),
        (
            "lil_matrix",
            "o = scipy.sparse.lil_matrix((2, 2))\no[0, 1] = 3",
            "(o.__setitem__((1, 1), 4), o.toarray().tolist())[1]",
        ),
        (
            "dok_matrix",
            "o = scipy.sparse.dok_matrix((3, 3))\no[2, 0] = 1.5",
            "o.toarray().tolist()",
        ),
        ("csr_array", "o = scipy.sparse.csr_array([[0, 1], [2, 0]])", "o.sum(axis=0).tolist()"),
    ],
    "scikit-learn": [
        (
            "LinearRegression",
            "o = sklearn.linear_model.LinearRegression().fit([[0], [1], [2]], [1, 3, 5])",
            "o.predict([[3]]).round(6).tolist()",
        ),
        (
            "RandomForestClassifier",
            "o = sklearn.ensemble.RandomForestClassifier(n_estimators=3, random_state=0).fit([[0], [1], [2], [3]], [0, 0, 1, 1])",
            "o.predict([[0.2], [2.8]]).tolist()",
        ),
        (
            "StandardScaler",
            "o = sklearn.preprocessing.StandardScaler().fit([[1.0], [3.0]])",
            "o.transform([[2.0]]).tolist()",
        ),
        (
            "Pipeline",
            "o = sklearn.pipeline.make_pipeline(sklearn.preprocessing.StandardScaler(), sklearn.linear_model.LogisticRegression()).fit([[0], [1], [2], [3]], [0, 0, 1, 1])",
            "o.predict([[0.5], [2.5]]).tolist()",
        ),
        (
            "KMeans",
            "o = sklearn.cluster.KMeans(2, n_init=1, random_state=0).fit([[0, 0], [0, 1], [9, 9], [9, 8]])",
            "sorted(np.bincount(o.labels_).tolist())",
        ),
        (
            "PCA",
            "o = sklearn.decomposition.PCA(1).fit([[0.0, 0.0], [1.0, 1.0], [2.0, 2.1]])",
            "o.transform([[3.0, 3.0]]).round(4).tolist()",
        ),
        (
            "TfidfVectorizer",
            "o = sklearn.feature_extraction.text.TfidfVectorizer().fit(['one spot book', 'one book'])",
            "o.transform(['spot book']).toarray().round(4).tolist()",
        ),
        (
            "DecisionTreeClassifier",
            "o = sklearn.tree.DecisionTreeClassifier(random_state=0).fit([[0], [1], [2], [3]], [0, 0, 1, 1])",
            "o.predict([[0.4], [2.6]]).tolist()",
        ),
        (
            "OneHotEncoder",
            "o = sklearn.preprocessing.OneHotEncoder().fit([['a'], ['b']])",
            "o.transform([['b']]).toarray().tolist()",
        ),
        (
            "SimpleImputer",
            "o = sklearn.impute.SimpleImputer().fit([[1.0], [float('nan')], [3.0]])",
            "o.transform([[float('nan')]]).tolist()",
        ),
        (
            "GridSearchCV",
            "o = sklearn.model_selection.GridSearchCV(sklearn.linear_model.Ridge(), {'alpha': [0.1, 10.0]}, cv=2).fit([[0], [1], [2], [3]], [0, 1, 2, 3])",
            "(o.best_params_, o.predict([[4]]).round(4).tolist())",
        ),
    ],
    "matplotlib": [
        (
            "Figure",
            "o = matplotlib.figure.Figure(figsize=(2, 1))\no.add_subplot().plot([1, 2])",
            "(o.get_size_inches().tolist(), len(o.axes))",
        ),
        ("Line2D", "o = matplotlib.lines.Line2D([0, 1], [2, 3])", "o.get_ydata().tolist()"),
        ("Colormap", "o = matplotlib.colormaps['viridis']", "[round(c, 4) for c in o(0.5)]"),
        (
            "Path",
            "o = matplotlib.path.Path([[0, 0], [1, 0], [1, 1]])",
            "bool(o.contains_point([0.9, 0.1]))",
        ),
    ],
    "polars": [
        ("DataFrame", "o = pl.DataFrame({'a': [1, 2, 3]})", "o.select(pl.col('a').sum()).item()"),
        ("Series", "o = pl.Series('s', [1.5, 2.5])", "o.mean()"),
        ("LazyFrame", "o = pl.LazyFrame({'a': [3, 1]}).sort('a')", "o.collect()['a'].to_list()"),
    ],
    "statsmodels": [
        (
            "OLS results",
            "o = sm.OLS([1.0, 3.0, 5.1], sm.add_constant([0.0, 1.0, 2.0])).fit()",
            "[round(float(p), 4) for p in o.params]",
        ),
        (
            "GLM results (Poisson)",
            "o = sm.GLM([1, 0, 2, 3], sm.add_constant([0.0, 1.0, 2.0, 3.0]), family=sm.families.Poisson()).fit()",
            "[round(float(p), 4) for p in o.params]",
        ),
        (
            "formula OLS results",
            "o = smf.ols('y ~ x', {'x': [0.0, 1.0, 2.0, 3.0], 'y': [1.0, 2.9, 5.2, 7.1]}).fit()",
            "(round(float(o.rsquared), 6), [round(float(v), 4) for v in o.predict({'x': [4.0]})])",
        ),
        (
            "Logit results",
            "o = sm.Logit([0, 0, 1, 0, 1, 1], sm.add_constant([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])).fit(disp=0)",
            "[round(float(p), 3) for p in o.params]",
        ),
    ],
    "lightgbm": [
        (
            "LGBMRegressor",
            "o = lightgbm.LGBMRegressor(n_estimators=5, min_child_samples=1, verbose=-1).fit(np.arange(20.0).reshape(-1, 1), np.arange(20.0))",
            "o.predict([[3.0]]).round(4).tolist()",
        ),
    ],
    "pillow": [
        ("Image", "o = PIL.Image.new('RGB', (2, 2), (10, 20, 30))", "o.getpixel((1, 1))"),
    ],
    "networkx": [
        ("Graph", "o = nx.path_graph(4)", "nx.shortest_path(o, 0, 3)"),
        ("DiGraph", "o = nx.DiGraph([(1, 2), (2, 3)])", "list(nx.topological_sort(o))"),
    ],
    "sympy": [
        ("expression", "o = sympy.Symbol('x') ** 2 + 1", "str(sympy.diff(o))"),
        ("Matrix", "o = sympy.Matrix([[1, 2], [3, 4]])", "str(o.det())"),
    ],
    "torch": [
        ("Tensor", "o = torch.arange(4.0)", "o.mul(2).tolist()"),
        (
            "nn.Linear",
            "torch.manual_seed(0)\no = torch.nn.Linear(2, 1)",
            "[round(v, 5) for v in o(torch.ones(1, 2)).flatten().tolist()]",
        ),
        (
            "Adam",
            "o_param = torch.nn.Parameter(torch.ones(2))\no = torch.optim.Adam([o_param], lr=0.1)\no_param.sum().backward()\no.step()",
            "(o.step(), [round(v, 5) for v in o_param.tolist()])[1]",
        ),
        (
            "torch.Generator",
            "o = torch.Generator().manual_seed(3)\ntorch.rand(1, generator=o)",
            "[round(v, 6) for v in torch.rand(2, generator=o).tolist()]",
        ),
        ("device", "o = torch.device('cpu')", "str(o)"),
        (
            "nn.Sequential",
            "torch.manual_seed(1)\no = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))",
            "[round(v, 5) for v in o(torch.ones(2, 3)).flatten().tolist()]",
        ),
        (
            "nn.Conv2d",
            "torch.manual_seed(2)\no = torch.nn.Conv2d(1, 2, 3)",
            "(list(o(torch.ones(1, 1, 4, 4)).shape), round(float(o(torch.ones(1, 1, 4, 4)).sum()), 4))",
        ),
        (
            "nn.LSTM",
            "torch.manual_seed(3)\no = torch.nn.LSTM(2, 3, batch_first=True)",
            "[round(v, 5) for v in o(torch.ones(1, 2, 2))[0].flatten().tolist()]",
        ),
        (
            "SGD (momentum)",
            "o_param = torch.nn.Parameter(torch.ones(2))\no = torch.optim.SGD([o_param], lr=0.1, momentum=0.9)\n(o_param ** 2).sum().backward()\no.step()",
            "(o.step(), [round(v, 5) for v in o_param.tolist()])[1]",
        ),
        (
            "lr_scheduler.StepLR",
            "o = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0), step_size=1, gamma=0.5)\no.optimizer.step()\no.step()",
            "(o.optimizer.step(), o.step(), o.get_last_lr())[2]",
        ),
        (
            "DataLoader",
            "o = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(6.0)), batch_size=4)",
            "[b[0].tolist() for b in o]",
        ),
        (
            "distributions.Normal",
            "o = torch.distributions.Normal(torch.tensor(0.0), torch.tensor(2.0))",
            "round(float(o.log_prob(torch.tensor(1.0))), 6)",
        ),
        (
            "sparse COO tensor",
            "o = torch.sparse_coo_tensor([[0, 1], [1, 0]], [3.0, 4.0], (2, 2))",
            "(o * 2).to_dense().tolist()",
        ),
    ],
    "xarray": [
        (
            "DataArray",
            "o = xr.DataArray(np.arange(6.0).reshape(2, 3), dims=('x', 'y'), coords={'x': [10, 20]})",
            "o.sel(x=20).sum().item()",
        ),
        (
            "Dataset",
            "o = xr.Dataset({'t': ('time', [1.0, 2.0, 4.0])}, coords={'time': [0, 1, 2]})",
            "float(o.t.diff('time').mean())",
        ),
        (
            "DataArrayRolling",
            "o = xr.DataArray([1.0, 2.0, 3.0, 4.0], dims='t').rolling(t=2)",
            "o.sum().values.tolist()",
        ),
    ],
    "dask": [
        (
            "dask.array.Array",
            "o = dask.array.arange(12, chunks=4).reshape(3, 4)",
            "o.sum(axis=0).compute(scheduler='sync').tolist()",
        ),
        ("Delayed", "o = dask.delayed(sum)([1, 2, 3])", "o.compute(scheduler='sync')"),
        (
            "Bag",
            "o = dask.bag.from_sequence(range(6), npartitions=2).map(lambda v: v * 3)",
            "sorted(o.compute(scheduler='sync'))",
        ),
        (
            "dask DataFrame",
            "o = dask.dataframe.from_pandas(pd.DataFrame({'a': range(6)}), npartitions=2)",
            "int(o.a.sum().compute(scheduler='sync'))",
        ),
    ],
    "seaborn": [
        (
            "color_palette",
            "o = sns.color_palette('deep', 3)",
            "[tuple(round(c, 4) for c in rgb) for rgb in o]",
        ),
        (
            "FacetGrid",
            "o = sns.FacetGrid(pd.DataFrame({'a': [1, 2, 3, 4], 'k': ['p', 'q', 'p', 'q']}), col='k')",
            "(o.axes.shape, sorted(o.col_names))",
        ),
        (
            "objects.Plot",
            "o = so.Plot({'x': [1, 2, 3], 'y': [2, 4, 6]}, x='x', y='y').add(so.Line())",
            "o.plot()._figure.axes[0].get_lines()[0].get_ydata().tolist()",
        ),
    ],
    "plotly": [
        (
            "graph_objects.Figure",
            "o = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={'title': {'text': 't'}})",
            "(o.layout.title.text, list(o.data[0].y))",
        ),
        ("Scatter trace", "o = go.Scatter(y=[5, 6], mode='lines')", "(o.mode, list(o.y))"),
        ("express figure", "o = px.bar(x=['a', 'b'], y=[1, 3])", "list(o.data[0].y)"),
    ],
    "transformers": [
        (
            "BertTokenizer (local vocabulary)",
            "o = transformers.BertTokenizer('obj_vocab.txt')",
            "o('hello spotbook')['input_ids']",
        ),
        (
            "tokenizers BertWordPieceTokenizer",
            "o = tokenizers.BertWordPieceTokenizer('obj_vocab.txt')",
            "o.encode('hello spotbook world').tokens",
        ),
        (
            "tokenizers Tokenizer (WordPiece)",
            "o = tokenizers.Tokenizer(tokenizers.models.WordPiece.from_file('obj_vocab.txt', unk_token='[UNK]'))\no.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()",
            "o.encode('world spotbook hello').ids",
        ),
    ],
    "pydantic": [
        (
            "BaseModel (notebook class)",
            "class PM(pydantic.BaseModel):\n    a: int\n    b: list[str] = []\no = PM(a='3', b=['x'])",
            "(o.a * 2, o.model_dump(), PM.model_validate({'a': 4}).a)",
        ),
        ("TypeAdapter", "o = pydantic.TypeAdapter(list[int])", "o.validate_python(['1', 2])"),
    ],
    "attrs": [
        (
            "attrs.define (notebook class)",
            "@attrs.define\nclass AD:\n    a: int\n    b: int = 2\n    def total(self):\n        return self.a + self.b\no = AD(1)",
            "(o.total(), attrs.asdict(o))",
        ),
        (
            "attrs.frozen (notebook class)",
            "@attrs.frozen\nclass AF:\n    x: float\no = AF(1.5)",
            "(o.x, attrs.evolve(o, x=2.0).x)",
        ),
    ],
}
IMPORTS = {
    "stdlib": "import array, collections, csv, dataclasses, datetime, decimal, email.message, "
    "enum, fractions, functools, hashlib, io, ipaddress, itertools, json, logging, pathlib, "
    "queue, random, re, socket, sqlite3, string, struct, threading, types, uuid, weakref, "
    "xml.etree.ElementTree, zlib\nopen('obj_read.txt', 'w').write('one\\ntwo\\n')",
    "numpy": "import numpy as np",
    "pandas": "import pandas as pd",
    "scipy": "import scipy.interpolate, scipy.optimize, scipy.sparse, scipy.spatial, scipy.stats",
    "scikit-learn": "import sklearn.cluster, sklearn.decomposition, sklearn.ensemble, "
    "sklearn.feature_extraction.text, sklearn.impute, sklearn.linear_model, "
    "sklearn.model_selection, sklearn.pipeline, sklearn.preprocessing, sklearn.tree",
    "matplotlib": "import matplotlib, matplotlib.figure, matplotlib.lines, matplotlib.path",
    "polars": "import polars as pl",
    "statsmodels": "import statsmodels.api as sm, statsmodels.formula.api as smf",
    "lightgbm": "import lightgbm",
    "pillow": "import PIL.Image",
    "networkx": "import networkx as nx",
    "sympy": "import sympy",
    "torch": "import torch, torch.utils.data",
    "xarray": "import numpy as np, xarray as xr",
    "dask": "import dask, dask.array, dask.bag, dask.dataframe, pandas as pd",
    "seaborn": "import pandas as pd, seaborn as sns, seaborn.objects as so",
    "plotly": "import plotly.express as px, plotly.graph_objects as go",
    # a local vocabulary file: no model hub is reached
    "transformers": "import tokenizers, transformers\nopen('obj_vocab.txt', 'w').write('\\n'.join("
    "['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'hello', 'world', 'spot', '##book']))",
    "pydantic": "import pydantic",
    "attrs": "import attrs",
}
MODULES = {
    "scikit-learn": "sklearn",
    "pillow": "PIL",
    "stdlib": "json",
}


def available() -> list[str]:
    """The libraries installed here (the table covers those)."""
    return [lib for lib in ENTRIES if importlib.util.find_spec(MODULES.get(lib, lib)) is not None]


def cells(libraries: list[str]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The notebook's sources and, for each object, (library, class, variable)."""
    sources = [IMPORTS[lib] for lib in libraries]
    made: list[tuple[str, str, str]] = []
    for lib in libraries:
        for n, (cls, make, _) in enumerate(ENTRIES[lib]):
            var = f"o_{lib.replace('-', '_')}_{n}"
            sources.append(_rename(make, var))
            made.append((lib, cls, var))
    # killed in here, after the snapshots: with OBJ_GATE set it waits for that file, which
    # the test creates only after the kill (the run cannot end first on a fast machine)
    sources.append(
        "import os, time\n"
        "while os.environ.get('OBJ_GATE') and not os.path.exists(os.environ['OBJ_GATE']):\n"
        "    time.sleep(0.01)"
    )
    checks = [
        "def check(name, f):\n    try:\n        r = f()\n    except Exception as exc:\n"
        "        r = f'raised {type(exc).__name__}'\n    print(f'OBJ {name}: {r!r}')"
    ]
    for lib in libraries:
        for n, (cls, _, behaviour) in enumerate(ENTRIES[lib]):
            var = f"o_{lib.replace('-', '_')}_{n}"
            checks.append(f"check({f'{lib}|{cls}'!r}, lambda: {_rename(behaviour, var)})")
    sources.append("\n".join(checks))
    return sources, made


def _rename(code: str, var: str) -> str:
    """``o`` (and ``o_param``) in an entry's code, renamed to the cell's variable."""
    import re

    return re.sub(r"\bo(_param)?\b", lambda m: var + (m.group(1) or ""), code)


def write(path: Path, libraries: list[str]) -> list[tuple[str, str, str]]:
    sources, made = cells(libraries)
    write_notebook(path, *sources)
    return made


def results(nb_path: Path) -> dict[str, str]:
    import re

    nb = json.loads(nb_path.read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    return {m.group(1): m.group(2) for m in re.finditer(r"^OBJ ([^:]+): (.*)$", text, re.M)}


def run_table(where: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the notebook uninterrupted, then killed after its snapshots and resumed on a
    wiped node (its working directory, home and temporary directory emptied: the run
    store stands for the bucket); return one row per object: its behaviour both times
    and how it came back."""
    libraries = available()
    made = write(where / "objects.ipynb", libraries)
    run_env = {**os.environ, **(env or {})}
    # the run key outside the node (as a pod gets it from a Secret), unless pytest gave one
    run_env.setdefault("SPOTBOOK_CONFIG_DIR", str(where / "config"))
    spot = [sys.executable, "-m", "spotbook"]

    def cli(*args: str, cwd: Path = where) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*spot, *args], cwd=cwd, env=run_env, capture_output=True, text=True, timeout=600
        )

    r = cli("run", "objects.ipynb", "ref.ipynb", "--run-dir", "ref")
    assert r.returncode == 0, r.stderr
    node = {name: where / f"node-{name}" for name in ("work", "home", "tmp")}
    for path in node.values():
        path.mkdir()
    run_env.update(HOME=str(node["home"]), TMPDIR=str(node["tmp"]))
    run_env["OBJ_GATE"] = str(where / "gate")  # the killed run and its resume wait for it
    rd = str(where / "rd")
    killed = ("--snapshot", "every-cell")
    proc = subprocess.Popen(
        [*spot, "run", str(where / "objects.ipynb"), "out.ipynb", *("--run-dir", rd), *killed],
        cwd=node["work"],
        env=run_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    sleeper = len(libraries) + len(made)  # the index of the sleeping cell
    snap = where / "rd" / "state" / "snap"
    deadline = time.monotonic() + 600
    while not (
        snap.is_dir() and any(n.startswith(f"{sleeper - 1:05d}-") for n in os.listdir(snap))
    ):
        assert time.monotonic() < deadline and proc.poll() is None, "no snapshot before the kill"
        time.sleep(0.05)  # a poll: the snapshot's manifest is the event waited for
    proc.kill()
    proc.communicate()
    node_lost(node["tmp"])
    for path in node.values():  # a new node: nothing of the killed run's is here
        shutil.rmtree(path)
        path.mkdir()
    (where / "gate").touch()
    r = cli("resume", rd, cwd=node["work"])
    assert r.returncode == 0, r.stderr
    status = json.loads(cli("status", rd, "--json").stdout)
    fidelity = status["attempts"][-1]["fidelity"]
    # the node was new: the files the cells wrote (obj.db, obj.mm, ...) came from the store
    assert (fidelity.get("files_restored") or {}).get("files", 0) >= 4, fidelity
    manifest = json.loads((snap / sorted(os.listdir(snap))[-1]).read_text())
    before, after = results(where / "ref.ipynb"), results(node["work"] / "out.ipynb")
    rows = []
    for lib, cls, var in made:
        key = f"{lib}|{cls}"
        entry = manifest["vars"].get(var, {})
        how = "restored" if entry.get("kind") in ("object", "module") else "replayed"
        if var in fidelity.get("chains", {}):
            how = "replayed"
        rows.append(
            {
                "library": lib,
                "class": cls,
                "how": how,
                "same": before.get(key) == after.get(key),
                "before": before.get(key),
                "after": after.get(key),
                "error": entry.get("error", ""),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| library | class | how it comes back | same behaviour after resume |",
        "|---|---|---|---|",
    ]
    for r in rows:
        how = r["how"] + (
            f" ({r['error'].split(':')[0]})" if r["how"] == "replayed" and r["error"] else ""
        )
        lines.append(
            f"| {r['library']} | {r['class']} | {how} | {'yes' if r['same'] else 'NO: ' + str(r['after'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_table(Path(tmp), {"PYTHONHASHSEED": "0"})
    print(markdown(rows))
    same = sum(r["same"] for r in rows)
    print(
        f"\n{len(rows)} classes: {same} behave the same after the resume; "
        f"{sum(r['how'] == 'restored' for r in rows)} restored from the snapshot, "
        f"{sum(r['how'] == 'replayed' for r in rows)} rebuilt by replaying their cells."
    )
